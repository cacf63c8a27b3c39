package balance_test

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/balancer"

	"github.com/regcluster/registry/balance"
)

// A pick and the Done of its successful call allocate nothing, with
// either picker, over a few instances and over many (the picker of a
// real channel over connected loopback backends).
func TestPickDoneAllocatesNothing(t *testing.T) {
	bs := startBackends(t, 12)
	var insts []inst
	for i, b := range bs {
		insts = append(insts, serving(b, uint32(100*(1+i%2))))
	}
	wrr := balance.DefaultPolicy()
	wrr.Picker = balance.PickerWRR
	for _, p := range []balance.Policy{balance.DefaultPolicy(), wrr} {
		for _, n := range []int{3, 12} {
			t.Run(fmt.Sprintf("%s/N=%d", p.Picker, n), func(t *testing.T) {
				pk, info := tappedPicker(t, balance.Name, tapped(t, p), insts[:n])
				di := balancer.DoneInfo{BytesSent: true, BytesReceived: true}
				allocs := testing.AllocsPerRun(1000, func() {
					res, err := pk.Pick(info)
					if err != nil {
						t.Fatal(err)
					}
					if res.Done != nil {
						res.Done(di)
					}
				})
				if allocs != 0 {
					t.Errorf("%.2f allocations per pick and Done, want 0", allocs)
				}
			})
		}
	}
}
