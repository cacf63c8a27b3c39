package render

import (
	"fmt"
	"testing"

	"github.com/regcluster/registry/internal/chunk"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// A chunked snapshot and a chunked events unit, joined with chunk.Joiner,
// print as one snapshot line with every instance and one line per event:
// never a partial unit.
func TestChunkedUnitsPrintWhole(t *testing.T) {
	var insts []*registryv1.Instance
	var evs []*registryv1.Event
	for i := range 50 {
		in := &registryv1.Instance{Service: "s", Id: fmt.Sprintf("i-%02d", i), Address: "10.0.0.1:80"}
		insts = append(insts, in)
		evs = append(evs, &registryv1.Event{Type: registryv1.Event_TYPE_PUT, Instance: in, Service: "s", Id: in.Id})
	}
	units := []*registryv1.WatchResponse{
		{Revision: 7, Kind: &registryv1.WatchResponse_Snapshot{Snapshot: &registryv1.Snapshot{Instances: insts}}},
		{Revision: 9, Kind: &registryv1.WatchResponse_Events{Events: &registryv1.Events{Events: evs}}},
	}
	var (
		j       chunk.Joiner
		lines   []WatchLine
		nChunks int
	)
	for _, u := range units {
		err := chunk.Split(u, 400, func(c *registryv1.WatchResponse) error {
			nChunks++
			whole, err := j.Add(c)
			if err != nil {
				return err
			}
			if whole != nil {
				lines = append(lines, NewWatchLines(whole)...)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if nChunks < 4 {
		t.Fatalf("only %d chunks: the units were not split", nChunks)
	}
	if len(lines) != 51 || lines[0].Type != WatchSnapshot || len(lines[0].Instances) != 50 {
		t.Fatalf("%d lines, first %s with %d instances; want one snapshot of 50 and 50 puts", len(lines), lines[0].Type, len(lines[0].Instances))
	}
	for _, l := range lines[1:] {
		if l.Type != WatchPut || l.Revision != 9 {
			t.Fatalf("line %+v, want puts at 9", l)
		}
	}
}
