package record

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Unmarshal decodes the binary protobuf b into m, as proto.Unmarshal does.
// When b is not a valid m it returns a *FieldError naming the field whose
// bytes are malformed, as a path of proto field names from m
// ("instance.address", "instance.metadata"), with why (not valid UTF-8, a
// truncated value); a failure no field can be blamed for (a malformed tag
// at the top) names whole. m is reset on failure.
func Unmarshal(b []byte, m proto.Message, whole string) error {
	err := proto.Unmarshal(b, m)
	if err == nil {
		return nil
	}
	proto.Reset(m)
	field, reason := blame(b, m.ProtoReflect().Descriptor(), "")
	if field == "" {
		field = whole
	}
	if reason == "" {
		// proto refused what the walk below let through: say what proto said.
		reason = fmt.Sprintf("not a valid %s: %v", m.ProtoReflect().Descriptor().FullName(), err)
	}
	return &FieldError{Field: field, Reason: reason}
}

// maxBlameDepth bounds the walk's recursion as proto bounds its own
// (protowire's default recursion limit), so a hostile nesting cannot blow
// the stack.
const maxBlameDepth = 100

// blame walks the wire format of b as a message of md and returns the path
// of the first field proto.Unmarshal would refuse and why, or "", "" if it
// finds none.
func blame(b []byte, md protoreflect.MessageDescriptor, path string) (field, reason string) {
	return blameDepth(b, md, path, 0)
}

func blameDepth(b []byte, md protoreflect.MessageDescriptor, path string, depth int) (field, reason string) {
	if depth > maxBlameDepth {
		return path, "nested too deep"
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return path, "malformed field tag: " + protowire.ParseError(n).Error()
		}
		fd := md.Fields().ByNumber(num)
		name := path
		if fd != nil {
			name = join(path, string(fd.Name()))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return name, "malformed value: " + protowire.ParseError(m).Error()
		}
		val := b[n : n+m]
		b = b[n+m:]
		// proto.Unmarshal keeps a known field of another wire type as an
		// unknown field, and unknown fields only need to be well formed.
		if fd == nil || typ != protowire.BytesType {
			continue
		}
		v, _ := protowire.ConsumeBytes(val)
		switch {
		case fd.IsMap():
			entry := fd.Message()
			if f, r := blameDepth(v, entry, "", depth+1); r != "" {
				// The entry's own fields are "key" and "value": blame the map.
				return name, "an entry's " + nonEmpty(f, "bytes") + " is " + r
			}
		case fd.Kind() == protoreflect.MessageKind:
			if f, r := blameDepth(v, fd.Message(), name, depth+1); r != "" {
				return f, r
			}
		case fd.Kind() == protoreflect.StringKind:
			if !utf8.Valid(v) {
				return name, "not valid UTF-8"
			}
		case fd.IsList() && fd.Kind() != protoreflect.BytesKind:
			if r := packedProblem(v, fd.Kind()); r != "" {
				return name, r
			}
		}
	}
	return "", ""
}

// packedProblem checks a packed repeated scalar field's payload.
func packedProblem(v []byte, k protoreflect.Kind) string {
	for len(v) > 0 {
		var n int
		switch k {
		case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
			_, n = protowire.ConsumeFixed32(v)
		case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
			_, n = protowire.ConsumeFixed64(v)
		default:
			_, n = protowire.ConsumeVarint(v)
		}
		if n < 0 {
			return "malformed packed value: " + protowire.ParseError(n).Error()
		}
		v = v[n:]
	}
	return ""
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func nonEmpty(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}
