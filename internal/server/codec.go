package server

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/record"
)

// DecodeOptions returns the server options under which a request that is
// not valid protobuf of its type (truncated, a malformed tag, a string
// that is not UTF-8) fails with InvalidArgument naming the field, carried
// as errdetails.BadRequest, before any handler runs, instead of grpc-go's
// Internal, and under which a handler may send an Encoded message (Watch
// does: it needs them). They are one codec and its two interceptors: use
// all of them or none.
//
// Why not only a codec: grpc-go wraps every error a codec's Unmarshal
// returns in codes.Internal (rpc_util.go recv), so the codec cannot say
// InvalidArgument itself. It leaves the message it could not decode empty
// but for a mark saying why, and returns nil; the interceptors receive
// that same message before the handler (unary) or from RecvMsg (streams)
// and refuse the call. The mark lives in the message, not in state shared
// with the interceptors, so an interceptor that ends a call early (an
// auth check, say) leaves nothing behind.
func DecodeOptions() []grpc.ServerOption {
	c := requestCodec{base: encoding.GetCodecV2(protoenc.Name)}
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(c),
		grpc.ChainUnaryInterceptor(refuseUndecodedUnary),
		grpc.ChainStreamInterceptor(refuseUndecodedStream),
	}
}

// requestCodec is grpc-go's proto codec, except that a message it cannot
// decode is marked as such instead of an error, and that an Encoded
// message is sent as it is.
type requestCodec struct {
	base encoding.CodecV2
}

func (c requestCodec) Name() string { return protoenc.Name }

func (c requestCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch e := v.(type) {
	case Encoded:
		// A SliceBuffer's Free does nothing, so grpc-go freeing it after
		// the write leaves the bytes to every other stream sending them.
		return mem.BufferSlice{mem.SliceBuffer(e)}, nil
	case EncodedParts:
		bs := make(mem.BufferSlice, len(e))
		for i, p := range e {
			bs[i] = mem.SliceBuffer(p)
		}
		return bs, nil
	}
	return c.base.Marshal(v)
}

// Encoded is a message already in its wire form (a WatchResponse chunk
// the fan-out encoded once for every subscriber, see fanout.Unit.Chunks):
// SendMsg(Encoded(b)) on a stream of a server built with DecodeOptions
// writes b as the message, without marshalling it again or copying it.
// grpc.PreparedMsg cannot be shared so: it is bound to one stream's codec
// and compressor. The bytes must be a valid message of the stream's type,
// and never change once sent: every stream may still be writing them.
// A compressor, if the client asked for one, compresses them per stream
// as usual.
type Encoded []byte

// EncodedParts is a message in its wire form as parts written one after
// another, none of them copied: a few bytes of this stream's own (a
// field's tag and length) around bytes shared by every stream (a chunk of
// fanout.Unit.Chunks), so that wrapping a shared chunk costs each stream
// its few bytes, not a copy of the chunk. The same rules as Encoded hold
// for every part.
type EncodedParts [][]byte

func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	m, ok := v.(proto.Message)
	if err == nil || !ok {
		return err
	}
	// The failure path only: decode again to find the field to blame.
	// recv frees data after Unmarshal returns, not before.
	var fe *record.FieldError
	if !errors.As(record.Unmarshal(data.Materialize(), m, "request"), &fe) {
		fe = &record.FieldError{Field: "request", Reason: err.Error()}
	}
	mark(m, fe)
	return nil
}

// undecodable starts a mark: a field tag of number 0, which proto.Unmarshal
// never accepts, so the unknown fields of a message it decoded never start
// with it and a client cannot forge a mark.
const undecodable = 0x00

// mark empties m and leaves in its unknown fields why it did not decode.
func mark(m proto.Message, fe *record.FieldError) {
	proto.Reset(m)
	b := []byte{undecodable}
	b = protowire.AppendString(b, fe.Field)
	b = protowire.AppendString(b, fe.Reason)
	m.ProtoReflect().SetUnknown(b)
}

// marked returns why m did not decode, or nil if it did.
func marked(m any) *record.FieldError {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil
	}
	b := pm.ProtoReflect().GetUnknown()
	if len(b) == 0 || b[0] != undecodable {
		return nil
	}
	field, n := protowire.ConsumeString(b[1:])
	if n < 0 {
		return &record.FieldError{Field: "request", Reason: "not valid protobuf"}
	}
	reason, m2 := protowire.ConsumeString(b[1+n:])
	if m2 < 0 {
		reason = "not valid protobuf"
	}
	return &record.FieldError{Field: field, Reason: reason}
}

func refuseUndecodedUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if fe := marked(req); fe != nil {
		return nil, fieldStatus(fe)
	}
	return handler(ctx, req)
}

func refuseUndecodedStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, checkedStream{ss})
}

// checkedStream refuses, from RecvMsg, a message its codec could not decode.
type checkedStream struct{ grpc.ServerStream }

func (s checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if fe := marked(m); fe != nil {
		return fieldStatus(fe)
	}
	return nil
}

// fieldStatus is the InvalidArgument status of a field's failure: the
// message is fe's own ("invalid FIELD: REASON"), and the field travels as
// an errdetails.BadRequest violation, from which client.FromStatus
// rebuilds the *record.FieldError.
func fieldStatus(fe *record.FieldError) error {
	st := status.New(codes.InvalidArgument, fe.Error())
	withField, err := st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: fe.Field, Description: fe.Reason},
	}})
	if err != nil {
		// Only a detail that does not marshal (not UTF-8) gets here: the
		// message still names the field.
		return st.Err()
	}
	return withField.Err()
}
