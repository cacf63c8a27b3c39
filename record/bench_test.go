package record

import "testing"

// Validate runs on every record a reader decodes (every watch event of
// every regnode): these say what it costs.

func BenchmarkValidate(b *testing.B) {
	in := valid()
	in.Metadata = meta(8, 12, 24)
	b.ReportAllocs()
	for b.Loop() {
		if err := Validate(in); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	k := NewKeys("")
	in := valid()
	in.Metadata = meta(8, 12, 24)
	v, err := Encode(in)
	if err != nil {
		b.Fatal(err)
	}
	key := k.Instance(in.Service, in.Id)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.Decode(key, v, 1, 2); err != nil {
			b.Fatal(err)
		}
	}
}

// Element is what forwarding a record costs the watcher on top of
// Decode (instead of a proto.Marshal per record and per feed later).
func BenchmarkElement(b *testing.B) {
	in := valid()
	in.Metadata = meta(8, 12, 24)
	v, err := Encode(in)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if e := Element(1, v, 1<<20, 1<<21); len(e) < len(v) {
			b.Fatal("short element")
		}
	}
}
