package client

// Last-known-good on disk (Config.CacheDir). Each subscription of one
// service writes its live view to <CacheDir>/<service>.lkg: when it changes
// (at most once per diskEvery), every diskRefresh while a regnode keeps
// confirming it unchanged (so the saved time stays the age of the view, not
// of its last change), and on Close. A subscription that starts loads the
// file in parallel with subscribing, never before it (the nacos-sdk-go #519
// bug: a client that read its cache first and subscribed second served the
// file for as long as the read took, or for good when it failed): the disk
// view is applied only if no live snapshot came first, and the first live
// snapshot replaces it as a reset whatever its revision and epoch.
//
// The file is written atomically: a temporary file in the same directory,
// fsync, rename over the old one, fsync of the directory; a crash leaves
// the old file or the new one, never a mix. Its format:
//
//	"RLKG" | version (1 byte) | CRC-32C of the body (4 bytes, big endian) | body
//
// The body is protobuf wire format: 1 service, 2 epoch, 3 revision,
// 4 saved time (Unix nanoseconds), 5 a registryv1.ListResponse holding the
// instances. A file with the wrong magic, version, checksum or service, or
// saved longer than Config.CacheMaxAge ago, is ignored with a warning, and
// every instance is checked with record.Validate on load (junk is skipped
// and counted in the warning). A file of another epoch cannot be told on
// load (no regnode answers): it is served, says FromDisk, and is replaced by
// the first live snapshot like any other.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/regcluster/registry/cache"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
	"github.com/regcluster/registry/record"
)

// DefaultCacheMaxAge is how old a disk view may be and still be served: a
// day covers a registry outage across a night, and a list older than that
// names machines that may have been reused.
const DefaultCacheMaxAge = 24 * time.Hour

const (
	diskMagic   = "RLKG"
	diskVersion = 1
	diskSuffix  = ".lkg"
	// diskEvery bounds how often one subscription writes its file.
	diskEvery = time.Second
	// diskRefresh rewrites an unchanged but confirmed view, so its saved
	// time stays within a minute of its last confirmation.
	diskRefresh = time.Minute
	// diskMaxBytes bounds what a load reads: a bigger file is corrupt.
	diskMaxBytes = 256 << 20
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// diskPath is the file of service under dir. Service names are DNS-like
// and so fine as file names; anything that could leave dir is refused.
func diskPath(dir, service string) (string, error) {
	if err := record.ValidService(service); err != nil {
		return "", err
	}
	if strings.ContainsAny(service, `/\`) || service == "." || service == ".." {
		return "", fmt.Errorf("%w: service %q cannot name a file", ErrDiskCache, service)
	}
	return filepath.Join(dir, service+diskSuffix), nil
}

// diskView is one saved view.
type diskView struct {
	service   string
	epoch     string
	revision  int64
	saved     time.Time
	instances []*registryv1.Instance
	skipped   int // instances refused by record.Validate on load
}

// encodeDiskView returns the file content of v.
func encodeDiskView(v *diskView) ([]byte, error) {
	list, err := proto.Marshal(&registryv1.ListResponse{Instances: v.instances, Revision: v.revision, Epoch: v.epoch})
	if err != nil {
		return nil, fmt.Errorf("encode disk view of %s: %w", v.service, err)
	}
	var body []byte
	body = protowire.AppendTag(body, 1, protowire.BytesType)
	body = protowire.AppendString(body, v.service)
	body = protowire.AppendTag(body, 2, protowire.BytesType)
	body = protowire.AppendString(body, v.epoch)
	body = protowire.AppendTag(body, 3, protowire.VarintType)
	body = protowire.AppendVarint(body, uint64(v.revision))
	body = protowire.AppendTag(body, 4, protowire.VarintType)
	body = protowire.AppendVarint(body, uint64(v.saved.UnixNano()))
	body = protowire.AppendTag(body, 5, protowire.BytesType)
	body = protowire.AppendBytes(body, list)
	out := make([]byte, 0, len(diskMagic)+5+len(body))
	out = append(out, diskMagic...)
	out = append(out, diskVersion)
	out = binary.BigEndian.AppendUint32(out, crc32.Checksum(body, crcTable))
	return append(out, body...), nil
}

// decodeDiskView parses a file; instances that break record rules are
// skipped and counted.
func decodeDiskView(b []byte) (*diskView, error) {
	hdr := len(diskMagic) + 5
	switch {
	case len(b) < hdr || string(b[:len(diskMagic)]) != diskMagic:
		return nil, fmt.Errorf("%w: not a disk view (bad magic)", ErrDiskCache)
	case b[len(diskMagic)] != diskVersion:
		return nil, fmt.Errorf("%w: version %d, want %d", ErrDiskCache, b[len(diskMagic)], diskVersion)
	}
	body := b[hdr:]
	if got, want := crc32.Checksum(body, crcTable), binary.BigEndian.Uint32(b[len(diskMagic)+1:]); got != want {
		return nil, fmt.Errorf("%w: checksum %08x, header says %08x", ErrDiskCache, got, want)
	}
	v := &diskView{}
	var list []byte
	for len(body) > 0 {
		num, typ, n := protowire.ConsumeTag(body)
		if n < 0 {
			return nil, fmt.Errorf("%w: %v", ErrDiskCache, protowire.ParseError(n))
		}
		body = body[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			var s string
			s, n = protowire.ConsumeString(body)
			v.service = s
		case num == 2 && typ == protowire.BytesType:
			var s string
			s, n = protowire.ConsumeString(body)
			v.epoch = s
		case num == 3 && typ == protowire.VarintType:
			var x uint64
			x, n = protowire.ConsumeVarint(body)
			v.revision = int64(x)
		case num == 4 && typ == protowire.VarintType:
			var x uint64
			x, n = protowire.ConsumeVarint(body)
			v.saved = time.Unix(0, int64(x))
		case num == 5 && typ == protowire.BytesType:
			list, n = protowire.ConsumeBytes(body)
		default: // a field of a later minor change: skip it
			n = protowire.ConsumeFieldValue(num, typ, body)
		}
		if n < 0 {
			return nil, fmt.Errorf("%w: field %d: %v", ErrDiskCache, num, protowire.ParseError(n))
		}
		body = body[n:]
	}
	var lr registryv1.ListResponse
	if err := proto.Unmarshal(list, &lr); err != nil {
		return nil, fmt.Errorf("%w: instances: %v", ErrDiskCache, err)
	}
	if v.revision <= 0 || v.saved.IsZero() {
		return nil, fmt.Errorf("%w: header without a revision or saved time", ErrDiskCache)
	}
	for _, in := range lr.Instances {
		if record.Validate(in) != nil || in.Service != v.service {
			v.skipped++
			continue
		}
		v.instances = append(v.instances, in)
	}
	return v, nil
}

// writeFileAtomic replaces path with data: temp file in the same
// directory, fsync, rename, fsync of the directory.
func writeFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err = os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	defer d.Close()
	if err = d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}

// readDiskView loads path: nil and a wrapped ErrDiskCache (or
// os.ErrNotExist) when there is nothing to serve.
func readDiskView(path, service string, maxAge time.Duration, now time.Time) (*diskView, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, diskMaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %v", ErrDiskCache, path, err)
	}
	if len(b) > diskMaxBytes {
		return nil, fmt.Errorf("%w: %s is over %d bytes", ErrDiskCache, path, diskMaxBytes)
	}
	v, err := decodeDiskView(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if v.service != service {
		return nil, fmt.Errorf("%w: %s holds service %q", ErrDiskCache, path, v.service)
	}
	if age := now.Sub(v.saved); age > maxAge {
		return nil, fmt.Errorf("%w: %s was saved %s ago (%s), over the maximum age %s",
			ErrDiskCache, path, age.Round(time.Second), v.saved.UTC().Format(time.RFC3339), maxAge)
	}
	return v, nil
}

// diskCache is one subscription's file and its writer.
type diskCache struct {
	path, service string
	maxAge        time.Duration
	kick          chan struct{} // a write may be due
	stop          chan struct{} // closed by the subscription when it stops applying
	loaded        chan struct{} // closed when the loader is done with the file

	mu struct {
		sync.Mutex
		snap      *cache.Snapshot // the latest live view, nil before the first
		epoch     string
		confirmed time.Time
		wrote     time.Time // last successful write
		wroteRev  int64
		wroteEp   string
		wroteAt   time.Time // the confirmation time of what was written
	}
}

func newDiskCache(dir, service string, maxAge time.Duration) (*diskCache, error) {
	p, err := diskPath(dir, service)
	if err != nil {
		return nil, err
	}
	return &diskCache{path: p, service: service, maxAge: maxAge, kick: make(chan struct{}, 1), stop: make(chan struct{}),
		loaded: make(chan struct{})}, nil
}

// mark records the live view after a unit was applied (the subscription's
// goroutine, under applyMu) and wakes the writer when a write is due.
func (d *diskCache) mark(snap *cache.Snapshot, epoch string, now time.Time) {
	d.mu.Lock()
	d.mu.snap, d.mu.epoch, d.mu.confirmed = snap, epoch, now
	due := snap.Revision() != d.mu.wroteRev || epoch != d.mu.wroteEp || now.Sub(d.mu.wrote) >= diskRefresh
	d.mu.Unlock()
	if due {
		select {
		case d.kick <- struct{}{}:
		default:
		}
	}
}

// run is the writer: at most one write per diskEvery, and a last one when
// stop closes. The subscription owns it and waits for it.
//
// It starts once the loader is done with the file: a live view written
// first would only be read back by the loader, and a file still being
// opened by the loader (a slow disk) is left to it.
func (d *diskCache) run(s *Subscription) {
	select {
	case <-d.loaded:
	case <-d.stop:
		d.flush(s, true)
		return
	}
	for {
		select {
		case <-d.kick:
		case <-d.stop:
			d.flush(s, true)
			return
		}
		d.mu.Lock()
		wait := time.Until(d.mu.wrote.Add(diskEvery))
		d.mu.Unlock()
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-d.stop:
				t.Stop()
				d.flush(s, true)
				return
			}
		}
		d.flush(s, false)
	}
}

// flush writes the latest live view if it differs from the file, or the
// file is due a refresh, or (final) it was confirmed since written.
func (d *diskCache) flush(s *Subscription, final bool) {
	now := time.Now()
	d.mu.Lock()
	snap, epoch, confirmed := d.mu.snap, d.mu.epoch, d.mu.confirmed
	due := snap != nil && (snap.Revision() != d.mu.wroteRev || epoch != d.mu.wroteEp ||
		confirmed.After(d.mu.wroteAt) && (final || now.Sub(d.mu.wrote) >= diskRefresh))
	d.mu.Unlock()
	if !due {
		return
	}
	data, err := encodeDiskView(&diskView{service: d.service, epoch: epoch, revision: snap.Revision(), saved: confirmed,
		instances: snap.Instances(d.service)})
	if err == nil {
		err = writeFileAtomic(d.path, data)
	}
	if err != nil {
		s.c.log.Warn("last-known-good view not saved", "service", d.service, "path", d.path, "err", err)
		d.mu.Lock()
		d.mu.wrote = now // retry after diskEvery, not in a loop
		d.mu.Unlock()
		return
	}
	d.mu.Lock()
	d.mu.wrote, d.mu.wroteRev, d.mu.wroteEp, d.mu.wroteAt = now, snap.Revision(), epoch, confirmed
	d.mu.Unlock()
}

// loadDisk reads the file and serves it unless a live snapshot came
// first. It runs beside the subscription's stream, never before it.
func (s *Subscription) loadDisk() {
	d := s.disk
	defer close(d.loaded)
	v, err := readDiskView(d.path, d.service, d.maxAge, time.Now())
	switch {
	case errors.Is(err, os.ErrNotExist):
		s.c.log.Debug("no last-known-good view on disk", "service", s.service, "path", d.path)
		return
	case err != nil:
		s.c.log.Warn("last-known-good view ignored", "service", s.service, "err", err)
		return
	}
	if v.skipped > 0 {
		s.c.log.Warn("last-known-good view: invalid instances skipped", "service", s.service, "path", d.path, "skipped", v.skipped)
	}
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if s.Freshness().Known {
		s.c.log.Debug("last-known-good view not needed: a regnode answered first", "service", s.service)
		return
	}
	b := cache.Batch{Revision: v.revision, Snapshot: true, Epoch: v.epoch, Instances: v.instances}
	if err := s.apply(b, v, nil); err != nil {
		s.c.log.Warn("last-known-good view ignored", "service", s.service, "err", err)
		return
	}
	s.c.metrics.DiskCacheLoaded(s.service, v.saved)
	s.c.log.Warn("no regnode answered yet: serving the last-known-good view from disk", "service", s.service,
		"instances", len(v.instances), "revision", v.revision, "epoch", v.epoch, "saved", v.saved.UTC().Format(time.RFC3339),
		"age", time.Since(v.saved).Round(time.Second))
}

// fromDiskSnapshot adjusts the first live snapshot that replaces a disk
// view: a reset, and a new epoch for the cache (so neither a lower
// revision is refused nor mod revisions of another history trusted) when
// it is not newer or is of another epoch than the file. Units before it
// are dropped (ok false): there is nothing live to fold them into.
func (s *Subscription) fromDiskSnapshot(ep string, b cache.Batch) (_ cache.Batch, ok bool) {
	s.mu.Lock()
	fromDisk, diskEpoch := s.mu.fromDisk, s.mu.diskEpoch
	s.mu.Unlock()
	if !fromDisk {
		return b, true
	}
	if !b.Snapshot {
		return b, false
	}
	otherEpoch := diskEpoch != "" && ep != "" && diskEpoch != ep
	if otherEpoch {
		s.c.log.Info("the disk view was of another epoch; replaced by the live one", "service", s.service,
			"disk_epoch", diskEpoch, "epoch", ep)
	}
	b.Reset = true
	b.NewEpoch = b.NewEpoch || otherEpoch || b.Revision <= s.cache.Revision()
	return b, true
}
