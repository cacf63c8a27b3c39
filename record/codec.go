package record

import (
	"fmt"

	"google.golang.org/protobuf/proto"

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
