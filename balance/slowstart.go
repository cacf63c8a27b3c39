package balance

import "time"

// RampPercent is slow start: the share of its weight (percent) an
// instance that became routable at since gets at now, and when that share
// next changes (zero: never). The steps are 5, 25, 50 and 100%, each
// taking a third of window. since comes from the record (when the
// registry saw the instance become routable), so every client computes
// the same share at the same moment; a since in the future (clock skew)
// gives the first step. A zero since or window means no ramp.
func RampPercent(since, now time.Time, window time.Duration) (pct uint64, next time.Time) {
	if window <= 0 || since.IsZero() {
		return 100, time.Time{}
	}
	third := window / 3
	e := now.Sub(since)
	switch {
	case e < third:
		return 5, since.Add(third)
	case e < 2*third:
		return 25, since.Add(2 * third)
	case e < window:
		return 50, since.Add(window)
	}
	return 100, time.Time{}
}
