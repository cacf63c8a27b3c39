package server

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

func decode(t *testing.T, b []byte) (*registryv1.GetRequest, *record.FieldError) {
	t.Helper()
	c := requestCodec{base: encoding.GetCodecV2(protoenc.Name)}
	var m registryv1.GetRequest
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &m); err != nil {
		t.Fatalf("the codec returned %v: grpc-go would make it Internal", err)
	}
	return &m, marked(&m)
}

func TestCodecMarks(t *testing.T) {
	good, err := proto.Marshal(&registryv1.GetRequest{Service: "orders", Id: "o-1"})
	if err != nil {
		t.Fatal(err)
	}
	// Unknown fields of a good request are no mark.
	good = protowire.AppendBytes(protowire.AppendTag(good, 99, protowire.BytesType), []byte("x"))
	if m, fe := decode(t, good); fe != nil || m.Service != "orders" || m.Id != "o-1" {
		t.Fatalf("good request decoded to %v, mark %v", m, fe)
	}
	bad := protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "o\xff")
	if m, fe := decode(t, bad); fe == nil || fe.Field != "id" || fe.Reason != "not valid UTF-8" || m.Id != "" {
		t.Fatalf("bad request decoded to %v, mark %v", m, fe)
	}
	// No bytes that start as a mark decode, so no decoded message's
	// unknown fields start as one.
	for _, rest := range [][]byte{nil, {0x00}, {0x01}, {0x05, 'a', 'b', 'c', 'd', 'e'}, {0x02, 0x08, 0x01}} {
		if err := proto.Unmarshal(append([]byte{undecodable}, rest...), &registryv1.GetRequest{}); err == nil {
			t.Fatalf("% x decodes: a client could forge a mark", append([]byte{undecodable}, rest...))
		}
	}
	// A client that sends a mark's bytes forges nothing: they do not
	// decode, and the mark says so, not what the client wrote.
	var forged registryv1.GetRequest
	mark(&forged, &record.FieldError{Field: "service", Reason: "forged"})
	raw := forged.ProtoReflect().GetUnknown()
	if _, fe := decode(t, raw); fe == nil || fe.Field != "request" || fe.Reason == "forged" {
		t.Fatalf("forged mark decoded to %+v", fe)
	}
}

// An Encoded message goes out as its own bytes, not copied, so every
// stream sending one unit writes the same memory; anything else is
// marshalled as grpc-go's codec does.
func TestCodecSendsEncodedAsIs(t *testing.T) {
	c := requestCodec{base: encoding.GetCodecV2(protoenc.Name)}
	want, err := proto.Marshal(&registryv1.WatchResponse{Revision: 7, Epoch: "e"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Marshal(Encoded(want))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got.Len() != len(want) || &got[0].ReadOnlyData()[0] != &want[0] {
		t.Fatalf("Encoded marshalled to %d buffers of %d bytes, not the bytes given", len(got), got.Len())
	}
	got.Free()
	if want[0] != 0x08 {
		t.Fatal("freeing the sent message changed the shared bytes")
	}
	plain, err := c.Marshal(&registryv1.WatchResponse{Revision: 7, Epoch: "e"})
	if err != nil || !bytes.Equal(plain.Materialize(), want) {
		t.Fatalf("a message marshalled to % x (%v), want % x", plain.Materialize(), err, want)
	}
}

// EncodedParts go out as their own bytes too, one buffer a part, in
// order: the stream's few bytes and the shared chunk, neither copied.
func TestCodecSendsEncodedPartsAsIs(t *testing.T) {
	c := requestCodec{base: encoding.GetCodecV2(protoenc.Name)}
	head, shared := []byte{0x0a, 0x01, 'a'}, []byte{0x12, 0x02, 0x08, 0x07}
	got, err := c.Marshal(EncodedParts{head, shared})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || &got[0].ReadOnlyData()[0] != &head[0] || &got[1].ReadOnlyData()[0] != &shared[0] {
		t.Fatalf("EncodedParts marshalled to %d buffers, not the two parts given", len(got))
	}
	if want := append(append([]byte{}, head...), shared...); !bytes.Equal(got.Materialize(), want) {
		t.Fatalf("the message is % x, want % x", got.Materialize(), want)
	}
	got.Free()
	if shared[0] != 0x12 {
		t.Fatal("freeing the sent message changed the shared bytes")
	}
}
