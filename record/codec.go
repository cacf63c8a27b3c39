package record

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// Encode returns the stored form of inst: deterministic binary protobuf
// without the fields that etcd itself holds (mod and create revision).
func Encode(inst *registryv1.Instance) ([]byte, error) {
	c := proto.CloneOf(inst)
	c.ModRevision, c.CreateRevision = 0, 0
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode instance %s/%s: %w", inst.GetService(), inst.GetId(), err)
	}
	return b, nil
}

// Decode reads the record stored at key (a key of k's layout) with etcd's
// revisions for it. Anything that is not a valid record for that key (not
// protobuf, fails Validate, or names another service or id than its key)
// returns an error wrapping ErrJunk.
func (k Keys) Decode(key string, value []byte, createRev, modRev int64) (*registryv1.Instance, error) {
	service, id, ok := k.Parse(key)
	if !ok {
		return nil, fmt.Errorf("%w: key %q is not <prefix>instances/<service>/<id>", ErrJunk, key)
	}
	if len(value) > MaxRecordSize {
		return nil, fmt.Errorf("%w: %q holds %d bytes, at most %d", ErrJunk, key, len(value), MaxRecordSize)
	}
	inst := &registryv1.Instance{}
	if err := Unmarshal(value, inst, "instance"); err != nil {
		return nil, fmt.Errorf("%w: %q is not a registry.v1.Instance: %v", ErrJunk, key, err)
	}
	if err := Validate(inst); err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrJunk, key, err)
	}
	if inst.Service != service || inst.Id != id {
		return nil, fmt.Errorf("%w: %q holds instance %s/%s", ErrJunk, key, inst.Service, inst.Id)
	}
	inst.CreateRevision, inst.ModRevision = createRev, modRev
	return inst, nil
}

// Field numbers of the revisions Decode fills from etcd, read from the
// descriptor so they cannot drift from the schema.
var (
	fieldModRevision    = instanceField("mod_revision")
	fieldCreateRevision = instanceField("create_revision")
)

func instanceField(name protoreflect.Name) protowire.Number {
	fd := (&registryv1.Instance{}).ProtoReflect().Descriptor().Fields().ByName(name)
	if fd == nil || fd.Kind() != protoreflect.Int64Kind {
		panic("record: registry.v1.Instance has no int64 field " + string(name))
	}
	return fd.Number()
}

// Element returns the record stored as value, with etcd's revisions for
// it, as the protobuf field num of wire type bytes holding an Instance:
// its tag, its length, then value as it is followed by create_revision
// and mod_revision (both always written, even at zero). It does not
// decode: protobuf's merge (the last occurrence of a scalar field wins)
// makes the payload decode to exactly the instance Decode returns for the
// same arguments, unknown fields and all, whatever revisions value itself
// carries. It is how a record is forwarded without being encoded again
// (the fan-out sends it as an element of Snapshot.instances, field 1):
// call it only for a value Decode accepted, so junk is never forwarded.
//
// The result is one allocation, sized exactly; value is copied, so the
// caller may let etcd's buffer go.
func Element(num protowire.Number, value []byte, createRev, modRev int64) []byte {
	n := len(value) +
		protowire.SizeTag(fieldCreateRevision) + protowire.SizeVarint(uint64(createRev)) +
		protowire.SizeTag(fieldModRevision) + protowire.SizeVarint(uint64(modRev))
	b := make([]byte, 0, protowire.SizeTag(num)+protowire.SizeVarint(uint64(n))+n)
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b = append(b, value...)
	b = protowire.AppendTag(b, fieldCreateRevision, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(createRev))
	b = protowire.AppendTag(b, fieldModRevision, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(modRev))
}

// ElementPayload returns the Instance bytes of an element Element made
// (the slice after its tag and length, sharing its memory), or nil if e is
// not one length-delimited field and nothing after it.
func ElementPayload(e []byte) []byte {
	_, typ, n := protowire.ConsumeTag(e)
	if n < 0 || typ != protowire.BytesType {
		return nil
	}
	v, m := protowire.ConsumeBytes(e[n:])
	if m < 0 || n+m != len(e) {
		return nil
	}
	return v
}
