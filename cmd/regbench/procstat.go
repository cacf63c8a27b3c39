package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// rssBytes is the process's resident set (VmRSS of /proc/self/status).
func rssBytes() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return -1
			}
			return kb << 10
		}
	}
	return -1
}

// cpuTime is the process's user+system CPU time (getrusage).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// memSnap is the process's memory at one moment, after a full GC and
// returning freed memory to the OS (so RSS differences mean something).
type memSnap struct {
	rss        int64
	heapInuse  int64
	stackInuse int64
	goroutines map[string]int // by side label ("" unlabeled)
	heapStacks map[[32]uintptr]heapRec
}

type heapRec struct {
	bytes int64
	side  string
}

func takeMem(classify func(frames []string) string) memSnap {
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := memSnap{rss: rssBytes(), heapInuse: int64(ms.HeapInuse), stackInuse: int64(ms.StackInuse),
		goroutines: goroutinesBySide()}
	if classify != nil {
		s.heapStacks = heapProfile(classify)
	}
	return s
}

// goroutinesBySide counts goroutines by their "side" pprof label, from the
// goroutine profile (debug=1 prints each group's labels).
func goroutinesBySide() map[string]int {
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		return nil
	}
	out := map[string]int{}
	count := 0
	flush := func(side string) {
		if count > 0 {
			out[side] += count
			count = 0
		}
	}
	for line := range strings.Lines(b.String()) {
		line = strings.TrimSpace(line)
		switch {
		case strings.Contains(line, " @ ") && !strings.HasPrefix(line, "#"):
			flush("")
			n, err := strconv.Atoi(strings.Fields(line)[0])
			if err == nil {
				count = n
			}
		case strings.HasPrefix(line, "# labels:"):
			side := ""
			if i := strings.Index(line, `"side":"`); i >= 0 {
				rest := line[i+len(`"side":"`):]
				side = rest[:strings.IndexByte(rest, '"')]
			}
			flush(side)
		}
	}
	flush("")
	return out
}

// heapProfile returns the in-use bytes of every allocation site of the
// heap profile, with the side classify gives its stack. Exact only while
// runtime.MemProfileRate is 1 (fanout sets it so while subscribing).
func heapProfile(classify func(frames []string) string) map[[32]uintptr]heapRec {
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, false)
	for {
		recs = make([]runtime.MemProfileRecord, n+100)
		var ok bool
		n, ok = runtime.MemProfile(recs, false)
		if ok {
			recs = recs[:n]
			break
		}
	}
	out := make(map[[32]uintptr]heapRec, len(recs))
	for i := range recs {
		r := &recs[i]
		b := r.InUseBytes()
		if b == 0 {
			continue
		}
		var names []string
		frames := runtime.CallersFrames(r.Stack())
		for {
			f, more := frames.Next()
			names = append(names, f.Function)
			if !more {
				break
			}
		}
		h := out[r.Stack0]
		h.bytes += b
		h.side = classify(names)
		out[r.Stack0] = h
	}
	return out
}

// heapDelta sums after−before by side.
func heapDelta(before, after memSnap) map[string]int64 {
	out := map[string]int64{}
	for k, a := range after.heapStacks {
		out[a.side] += a.bytes - before.heapStacks[k].bytes
	}
	for k, b := range before.heapStacks {
		if _, ok := after.heapStacks[k]; !ok {
			out[b.side] -= b.bytes
		}
	}
	return out
}

// classifier returns a function naming the side of an allocation stack:
// the first side whose marker (a function name prefix or substring)
// appears in any frame, else "other".
func classifier(sides ...sideMarkers) func([]string) string {
	return func(frames []string) string {
		for _, s := range sides {
			for _, f := range frames {
				for _, m := range s.markers {
					if strings.Contains(f, m) {
						return s.side
					}
				}
			}
		}
		return "other"
	}
}

type sideMarkers struct {
	side    string
	markers []string
}

// cpuProfile samples the process's CPU for the duration of f and returns
// CPU time by "side" label. It fails if another CPU profile is running
// (regbench -cpuprofile).
func cpuProfile(f func()) (map[string]time.Duration, error) {
	var b bytes.Buffer
	if err := pprof.StartCPUProfile(&b); err != nil {
		f()
		return nil, err
	}
	f()
	pprof.StopCPUProfile()
	return cpuBySide(b.Bytes())
}

// cpuBySide reads a gzipped profile.proto CPU profile and sums the CPU
// nanoseconds of its samples by their "side" label. It decodes only what
// it needs (sample types, samples with values and labels, the string
// table) with protowire, to need no profile library.
func cpuBySide(gz []byte) (map[string]time.Duration, error) {
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	type label struct{ key, str int64 }
	type sample struct {
		vals   []int64
		labels []label
	}
	var (
		strs    []string
		types   []int64 // string index of each sample type's "type"
		samples []sample
	)
	b := raw
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType || (num != 1 && num != 2 && num != 6) {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		switch num {
		case 1: // ValueType{type=1, unit=2}
			fields, err := varints(v)
			if err != nil {
				return nil, err
			}
			types = append(types, fields[1][0])
		case 2: // Sample{location_id=1, value=2, label=3}
			var s sample
			for len(v) > 0 {
				fn, ft, k := protowire.ConsumeTag(v)
				if k < 0 {
					return nil, protowire.ParseError(k)
				}
				v = v[k:]
				switch {
				case fn == 2 && ft == protowire.BytesType: // packed values
					pv, k := protowire.ConsumeBytes(v)
					if k < 0 {
						return nil, protowire.ParseError(k)
					}
					v = v[k:]
					for len(pv) > 0 {
						x, k := protowire.ConsumeVarint(pv)
						if k < 0 {
							return nil, protowire.ParseError(k)
						}
						pv = pv[k:]
						s.vals = append(s.vals, int64(x))
					}
				case fn == 2 && ft == protowire.VarintType:
					x, k := protowire.ConsumeVarint(v)
					if k < 0 {
						return nil, protowire.ParseError(k)
					}
					v = v[k:]
					s.vals = append(s.vals, int64(x))
				case fn == 3 && ft == protowire.BytesType:
					lv, k := protowire.ConsumeBytes(v)
					if k < 0 {
						return nil, protowire.ParseError(k)
					}
					v = v[k:]
					fields, err := varints(lv)
					if err != nil {
						return nil, err
					}
					s.labels = append(s.labels, label{key: fields[1][0], str: fields[2][0]})
				default:
					k := protowire.ConsumeFieldValue(fn, ft, v)
					if k < 0 {
						return nil, protowire.ParseError(k)
					}
					v = v[k:]
				}
			}
			samples = append(samples, s)
		case 6:
			strs = append(strs, string(v))
		}
	}
	str := func(i int64) string {
		if i < 0 || int(i) >= len(strs) {
			return ""
		}
		return strs[i]
	}
	cpu := -1
	for i, t := range types {
		if str(t) == "cpu" {
			cpu = i
		}
	}
	if cpu < 0 {
		return nil, errors.New("profile has no cpu sample type")
	}
	out := map[string]time.Duration{}
	for _, s := range samples {
		if cpu >= len(s.vals) {
			continue
		}
		side := ""
		for _, l := range s.labels {
			if str(l.key) == "side" {
				side = str(l.str)
			}
		}
		out[side] += time.Duration(s.vals[cpu])
	}
	return out, nil
}

// varints decodes a message of varint fields into field number → values
// (fields 1..3 are always present in the result, possibly as 0).
func varints(b []byte) (map[protowire.Number][]int64, error) {
	out := map[protowire.Number][]int64{1: {0}, 2: {0}, 3: {0}}
	seen := map[protowire.Number]bool{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.VarintType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		x, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if !seen[num] {
			out[num], seen[num] = nil, true
		}
		out[num] = append(out[num], int64(x))
	}
	return out, nil
}

func kib(b float64) float64 { return round3(b / 1024) }

func fmtBytes(b int64) string {
	switch {
	case b >= 1<<30 || b <= -1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20 || b <= -1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
}
