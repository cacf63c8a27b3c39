package balance

import "testing"

// The second P2C draw never returns the first and covers every other
// candidate by its weight.
func TestDrawOther(t *testing.T) {
	cum := []uint64{100, 150, 350} // weights 100, 50, 200
	for ia, w := range []uint64{100, 50, 200} {
		counts := make([]uint64, 3)
		for r := uint64(0); r < 350-w; r++ {
			counts[drawOther(cum, ia, r)]++
		}
		for i, c := range counts {
			want := cum[i]
			if i > 0 {
				want -= cum[i-1]
			}
			if i == ia {
				want = 0
			}
			if c != want {
				t.Errorf("first %d: candidate %d drawn for %d values, want %d", ia, i, c, want)
			}
		}
	}
}
