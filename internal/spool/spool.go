// Package spool keeps verified webhook deliveries that could not be claimed
// (the store was unreachable) on local disk, durably, and hands them to a
// Deliverer once the store is back: the provider is answered 2xx only after
// the delivery's record and its directory entry are fsynced, so a provider
// that never redelivers (GitHub) loses nothing to a store outage.
//
// A spool is one directory, used by one process at a time (a lock file
// refuses a second). Records are appended to segment files, each record
// framed with its length and CRC-32C, so a record torn by a crash (kill -9,
// power loss) is recognised and dropped on the next Open; it was never
// acknowledged. Delivered records are acknowledged in a segment's ack file,
// and a segment whose records are all acknowledged is deleted.
//
// Records are first tried in arrival order, one at a time, by the attached
// Deliverer, which claims the event through the store like a live delivery:
// a record whose event is completed settles as a duplicate, one whose claim
// another gateway holds waits and is tried again, and only a won claim is
// forwarded. The package reads no state of the Caddy layer: settings come
// from Options and the Deliverer.
package spool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/coalesce"
)

// Defaults of Options, applied by Open when a field is zero.
const (
	// DefaultMaxBytes bounds the records waiting in a spool (1 GB).
	DefaultMaxBytes = 1_000_000_000
	// DefaultSegmentBytes is the size past which appends go to a new
	// segment file (4 MiB).
	DefaultSegmentBytes = 4 << 20
	// DefaultStoreRetry is the first wait after the store was unreachable;
	// it doubles up to DefaultMaxStoreRetry while the store stays down.
	DefaultStoreRetry    = 500 * time.Millisecond
	DefaultMaxStoreRetry = 5 * time.Second
	// DefaultRetryMin and DefaultRetryMax bound the backoff of a record the
	// upstream did not take: 1s, doubled per attempt, at most 5m.
	DefaultRetryMin = time.Second
	DefaultRetryMax = 5 * time.Minute
	// DefaultConcurrency is how many records are tried at once: each try
	// waits on the store's commits and the upstream, so a few in flight
	// share the store's group commit (docs/spool.md: the drain rate).
	DefaultConcurrency = 8
	// DefaultDeadAfter is how long the upstream may refuse a record, from
	// its first refusal, before the record is set aside (dead): kept,
	// counted and listed, no longer tried until an operator retries or
	// drops it.
	DefaultDeadAfter = 72 * time.Hour
)

// Errors of Append and Open.
var (
	// ErrFull: the record would take the spool past MaxBytes. The caller
	// answers 503: the delivery is neither claimed nor kept.
	ErrFull = errors.New("spool is full")
	// ErrClosed: the spool was closed.
	ErrClosed = errors.New("spool closed")
	// ErrLocked: another process uses the directory.
	ErrLocked = errors.New("spool directory is in use by another process")
	// ErrNoRecord: no waiting record has the sequence number (Drop).
	ErrNoRecord = errors.New("no such waiting record in the spool")
	// ErrNotDead: the record is not dead; only a dead record is dropped.
	ErrNotDead = errors.New("the record is not dead (set aside after its refusals)")
)

// Options configure a Spool. Zero values mean the defaults above.
type Options struct {
	// Dir is the spool's directory, created with mode 0700 when missing. An
	// existing directory must not be readable or writable by group or
	// others: records hold bodies and signature headers. Required.
	Dir string
	// MaxBytes bounds the bytes of the records waiting (frames included);
	// an Append past it fails with ErrFull.
	MaxBytes int64
	// SegmentBytes is the size past which a new segment file is started.
	SegmentBytes int64
	// StoreRetry, MaxStoreRetry, RetryMin, RetryMax: see the Default
	// constants.
	StoreRetry, MaxStoreRetry, RetryMin, RetryMax time.Duration
	// Concurrency is how many records are tried at once, started in
	// arrival order; two records of one event are never tried at once.
	// Default DefaultConcurrency.
	Concurrency int
	// DeadAfter is how long the upstream may refuse a record, from its
	// first refusal, before it is set aside (dead). Default
	// DefaultDeadAfter.
	DeadAfter time.Duration
	// Logger receives recovery notes and delivery failures with scope and
	// event ID; never a body or header. Default: zap.NewNop().
	Logger *zap.Logger
	// Now is the clock of arrival times and retries. Default: time.Now.
	Now func() time.Time
}

func (o *Options) defaults() {
	o.MaxBytes = cmp.Or(o.MaxBytes, DefaultMaxBytes)
	o.SegmentBytes = cmp.Or(o.SegmentBytes, DefaultSegmentBytes)
	o.StoreRetry = cmp.Or(o.StoreRetry, DefaultStoreRetry)
	o.MaxStoreRetry = cmp.Or(o.MaxStoreRetry, DefaultMaxStoreRetry)
	o.RetryMin = cmp.Or(o.RetryMin, DefaultRetryMin)
	o.RetryMax = cmp.Or(o.RetryMax, DefaultRetryMax)
	o.Concurrency = cmp.Or(max(o.Concurrency, 0), DefaultConcurrency)
	o.DeadAfter = cmp.Or(o.DeadAfter, DefaultDeadAfter)
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Spool is an open spool directory. Safe for concurrent use.
type Spool struct {
	o    Options
	lock *os.File
	// appends are group-committed: concurrent Appends share one write and
	// one fsync.
	c *coalesce.Coalescer[*pendingAppend]

	mu       sync.Mutex
	closed   bool
	segs     []*segment // oldest first; the last is the active one, if any
	active   *segment   // where appends go; nil until the first append
	pending  []*entry   // arrival order; entries are marked done, compacted lazily
	head     int        // index of the first entry not done
	live     int        // entries not done
	bytes    int64      // frame bytes of the entries not done
	reserved int64      // bytes of appends being written
	nextSeq  uint64
	counts   Counts

	// drain state (drain.go)
	deliverer   *attachment
	storeAfter  time.Time     // no delivery before this (the store was down)
	storeWait   time.Duration // the last wait after the store was down
	pausedUntil time.Time     // no delivery before this (the Deliverer was not ready)
	// inFlight counts the records being tried; busy, the events (scope
	// and ID) they carry.
	inFlight int
	busy     map[string]bool
	// probing: one record at a time until a try reaches the store (at
	// open, and after a try found it unavailable or the Deliverer not
	// ready), so an outage costs one failed try per wait, not Concurrency.
	probing bool
	// paused mirrors a set storeAfter, so Poke costs no lock while the
	// store is up.
	paused atomic.Bool
	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// segment is one segment file and its ack file.
type segment struct {
	first   uint64 // Seq of its first record: the file's name
	f       *os.File
	size    int64
	ack     *os.File // opened by the first acknowledgement
	ackSize int64
	live    int // records not acknowledged
	broken  bool
}

// entry is a record waiting in the spool, without its header and body.
type entry struct {
	seq     uint64
	seg     *segment
	off     int64 // frame's offset in seg
	size    int64 // frame's length, header included
	arrived time.Time
	scope   string
	eventID string

	attempts  int       // deliveries the upstream did not take
	notBefore time.Time // not tried again before
	last      Outcome   // the last try's outcome; 0 before the first
	done      bool
	// trying: being tried (or dropped) now; refused: the first refusal
	// of the current round; dead: set aside after refusals for DeadAfter.
	trying  bool
	refused time.Time
	dead    bool
}

// pendingAppend is one Append in a group commit.
type pendingAppend struct {
	rec     *Record
	payload []byte
	// state decides once who releases the append's reserved bytes: the
	// batch that takes it (appendTaken) or Append, when it gave up first.
	state atomic.Int32
}

// States of pendingAppend.state.
const (
	appendQueued int32 = iota
	appendTaken
	appendAbandoned
)

// Counts are the spool's events since it was opened.
type Counts struct {
	Spooled    uint64 `json:"spooled"`    // records appended
	Forwarded  uint64 `json:"forwarded"`  // records forwarded and taken by the upstream
	Duplicates uint64 `json:"duplicates"` // records whose event was completed meanwhile
	Refused    uint64 `json:"refused"`    // tries the upstream did not take (tried again)
	Waits      uint64 `json:"waits"`      // tries that found the claim held elsewhere (tried again)
	Full       uint64 `json:"full"`       // Appends refused with ErrFull
	Torn       uint64 `json:"torn"`       // torn records dropped by recovery
	Unreadable uint64 `json:"unreadable"` // records dropped because their frame no longer reads
	Dead       uint64 `json:"dead"`       // records set aside after refusals for DeadAfter
	Dropped    uint64 `json:"dropped"`    // dead records an operator dropped (Drop)
}

// Stats describe a spool at one moment, for metrics and the admin API.
type Stats struct {
	Dir string
	// Records and Bytes are the records waiting and their frame bytes.
	Records int
	Bytes   int64
	// MaxBytes is the bound of Bytes.
	MaxBytes int64
	// DiskBytes is what the spool's files take, acknowledged records not
	// yet deleted with their segment included.
	DiskBytes int64
	// Oldest is the arrival of the oldest waiting record; zero when none.
	Oldest time.Time
	// Waiting counts the records tried at least once and waiting to be
	// tried again (claim held elsewhere, upstream refused).
	Waiting int
	// Dead counts the records set aside (refused for DeadAfter), kept and
	// no longer tried until Retry or Drop; they are part of Records.
	Dead int
	// StoreDown is set while deliveries are paused because the store was
	// unreachable at the last try.
	StoreDown bool
	Counts    Counts
}

// Open opens (creating when missing) the spool in o.Dir, takes its lock,
// and recovers its records: torn records at the end of the last segment
// are dropped and cut off, acknowledged ones skipped, fully acknowledged
// segments deleted. Deliveries start when a Deliverer is attached.
func Open(o Options) (*Spool, error) {
	o.defaults()
	if o.Dir == "" {
		return nil, errors.New("spool: no directory")
	}
	if err := prepareDir(o.Dir); err != nil {
		return nil, err
	}
	lock, err := lockDir(o.Dir)
	if err != nil {
		return nil, err
	}
	s := &Spool{o: o, lock: lock, nextSeq: 1, wake: make(chan struct{}, 1), done: make(chan struct{}),
		busy: map[string]bool{}, probing: true}
	if err := s.recover(); err != nil {
		_ = s.closeFiles()
		return nil, err
	}
	s.c = coalesce.New(coalesce.Options{Writers: 1, Timeout: time.Minute}, s.write)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.run()
	return s, nil
}

// prepareDir creates dir (0700) or checks that an existing one is private.
// CheckDir checks that dir, if it exists, is a directory closed to other
// users, as Open does, without creating, locking or reading it: for a
// process that only validates a config while a running gateway holds the
// spool. A missing directory is created by Open.
func CheckDir(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return prepareDir(dir)
}

func prepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("spool: creating directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("spool: %s is not a directory", dir)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("spool: directory %s has mode %#o, readable or writable by others, "+
			"and spooled deliveries hold bodies and signatures: chmod 700 it, or name a new directory", dir, perm)
	}
	return nil
}

const (
	segPrefix = "seg-"
	logSuffix = ".log"
	ackSuffix = ".ack"
)

func (s *Spool) logPath(first uint64) string {
	return filepath.Join(s.o.Dir, fmt.Sprintf("%s%020d%s", segPrefix, first, logSuffix))
}

func (s *Spool) ackPath(first uint64) string {
	return filepath.Join(s.o.Dir, fmt.Sprintf("%s%020d%s", segPrefix, first, ackSuffix))
}

// recover reads every segment in order. Only the last segment can end in a
// torn record (appends go to the newest file); it is cut off there. A bad
// frame inside an older segment is a disk fault, not a crash: the records
// after it in that file are unreadable, logged and counted.
func (s *Spool) recover() error {
	names, err := os.ReadDir(s.o.Dir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	var firsts []uint64
	for _, de := range names {
		n := de.Name()
		if !strings.HasPrefix(n, segPrefix) || !strings.HasSuffix(n, logSuffix) {
			continue
		}
		first, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(n, segPrefix), logSuffix), 10, 64)
		if err != nil {
			continue
		}
		firsts = append(firsts, first)
	}
	slices.Sort(firsts)
	changed := false
	for i, first := range firsts {
		last := i == len(firsts)-1
		seg, entries, cut, err := s.readSegment(first, last)
		if err != nil {
			return err
		}
		changed = changed || cut
		s.segs = append(s.segs, seg)
		for _, e := range entries {
			s.nextSeq = max(s.nextSeq, e.seq+1)
			if e.done {
				continue
			}
			s.pending = append(s.pending, e)
			s.live++
			s.bytes += e.size
			seg.live++
		}
	}
	// Appends after a restart go to a new segment: a recovered file is
	// never written again.
	for _, seg := range slices.Clone(s.segs) {
		if seg.live == 0 {
			s.dropSegment(seg)
			changed = true
		}
	}
	if changed {
		return syncDir(s.o.Dir)
	}
	return nil
}

// readSegment reads one segment and its acks. cut reports that a torn tail
// was cut off (the directory needs no sync for that, the file does).
func (s *Spool) readSegment(first uint64, last bool) (*segment, []*entry, bool, error) {
	path := s.logPath(first)
	f, err := os.OpenFile(path, os.O_RDWR, 0o600) //nolint:gosec // a segment of the spool directory
	if err != nil {
		return nil, nil, false, fmt.Errorf("spool: opening segment: %w", err)
	}
	seg := &segment{first: first, f: f}
	data, err := os.ReadFile(path) //nolint:gosec // a file of the spool directory
	if err != nil {
		_ = f.Close()
		return nil, nil, false, fmt.Errorf("spool: reading segment: %w", err)
	}
	var entries []*entry
	off := int64(0)
	for off < int64(len(data)) {
		p, ok := frameAt(data, off)
		if !ok {
			break
		}
		r, err := decodePayload(p, false)
		if err != nil {
			break
		}
		size := int64(frameHeader + len(p))
		entries = append(entries, &entry{seq: r.Seq, seg: seg, off: off, size: size, arrived: r.Arrived,
			scope: r.Scope, eventID: r.EventID})
		off += size
	}
	seg.size = off
	cut := false
	if rest := int64(len(data)) - off; rest > 0 {
		if last {
			s.counts.Torn++
			s.o.Logger.Warn("spool: dropped a record torn by a crash (never acknowledged to the provider)",
				zap.String("file", filepath.Base(path)), zap.Int64("offset", off), zap.Int64("bytes", rest))
			if err := f.Truncate(off); err != nil {
				_ = f.Close()
				return nil, nil, false, fmt.Errorf("spool: cutting a torn record: %w", err)
			}
			if err := f.Sync(); err != nil {
				_ = f.Close()
				return nil, nil, false, fmt.Errorf("spool: cutting a torn record: %w", err)
			}
			cut = true
		} else {
			s.counts.Unreadable++
			seg.broken = true
			s.o.Logger.Error("spool: a segment does not read past a bad frame; the records after it are lost",
				zap.String("file", filepath.Base(path)), zap.Int64("offset", off), zap.Int64("bytes", rest))
		}
	}
	acked, err := s.readAcks(seg)
	if err != nil {
		_ = f.Close()
		return nil, nil, false, err
	}
	for _, e := range entries {
		e.done = acked[e.seq]
	}
	return seg, entries, cut, nil
}

// frameAt returns the payload of the frame at off, or false when the frame
// is cut short or its CRC does not match.
func frameAt(data []byte, off int64) ([]byte, bool) {
	if int64(len(data))-off < frameHeader {
		return nil, false
	}
	h := data[off : off+frameHeader]
	n := int64(uint32(h[0])<<24 | uint32(h[1])<<16 | uint32(h[2])<<8 | uint32(h[3]))
	if n > maxPayload || int64(len(data))-off-frameHeader < n {
		return nil, false
	}
	p := data[off+frameHeader : off+frameHeader+n]
	crc := uint32(h[4])<<24 | uint32(h[5])<<16 | uint32(h[6])<<8 | uint32(h[7])
	if checksum(p) != crc {
		return nil, false
	}
	return p, true
}

// readAcks reads a segment's ack file, if any, and opens it for appending.
func (s *Spool) readAcks(seg *segment) (map[uint64]bool, error) {
	path := s.ackPath(seg.first)
	data, err := os.ReadFile(path) //nolint:gosec // a file of the spool directory
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("spool: reading acks: %w", err)
	}
	acked := make(map[uint64]bool)
	n := int64(0)
	for len(data)-int(n) >= ackSize {
		seq, ok := readAck(data[n:])
		if !ok {
			break
		}
		acked[seq] = true
		n += ackSize
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0o600) //nolint:gosec // a file of the spool directory
	if err != nil {
		return nil, fmt.Errorf("spool: opening acks: %w", err)
	}
	if int64(len(data)) != n {
		// A torn entry: its record is delivered again and found completed.
		if err := f.Truncate(n); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("spool: cutting a torn ack: %w", err)
		}
	}
	seg.ack, seg.ackSize = f, n
	return acked, nil
}

// Append writes r to the spool and returns once it is durable: the record
// is written and fsynced, and so is the directory when the record started
// a new segment file. It sets r.Seq (and r.Arrived when zero). It returns
// ErrFull when the record would take the spool past MaxBytes, ErrClosed
// after Close, ctx's error when ctx ended first (the record may still have
// been written; it is then delivered like any other), or the disk's error.
func (s *Spool) Append(ctx context.Context, r *Record) error {
	if r.Arrived.IsZero() {
		r.Arrived = s.o.Now()
	}
	p := encodePayload(r)
	size := int64(frameHeader + len(p))
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	if s.bytes+s.reserved+size > s.o.MaxBytes {
		s.counts.Full++
		s.mu.Unlock()
		return ErrFull
	}
	s.reserved += size
	s.mu.Unlock()
	pa := &pendingAppend{rec: r, payload: p}
	err := s.c.Do(ctx, pa)
	if err != nil && pa.state.CompareAndSwap(appendQueued, appendAbandoned) {
		// Never taken by a batch (closed, or ctx ended while queued).
		s.mu.Lock()
		s.reserved -= size
		s.mu.Unlock()
	}
	return err
}

// write is the group commit of Appends: every payload of the batch gets
// its Seq, the frames are written with one write and one fsync (and the
// directory's, for a new segment), then the records join the queue. A
// failed write or fsync fails the whole batch and retires the segment, so
// no later record follows bytes of unknown state.
func (s *Spool) write(_ context.Context, all []*pendingAppend) error {
	batch := make([]*pendingAppend, 0, len(all))
	for _, pa := range all {
		if pa.state.CompareAndSwap(appendQueued, appendTaken) {
			batch = append(batch, pa)
		}
	}
	if len(batch) == 0 {
		return nil
	}
	var total int64
	for _, pa := range batch {
		total += int64(frameHeader + len(pa.payload))
	}
	s.mu.Lock()
	release := func() { s.reserved -= total }
	if s.closed {
		release()
		s.mu.Unlock()
		return ErrClosed
	}
	seg := s.active
	newSeg := seg == nil || seg.broken || seg.size >= s.o.SegmentBytes
	first := s.nextSeq
	s.nextSeq += uint64(len(batch))
	s.mu.Unlock()

	fail := func(err error) error {
		s.mu.Lock()
		release()
		s.mu.Unlock()
		return err
	}
	if newSeg {
		f, err := os.OpenFile(s.logPath(first), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fail(fmt.Errorf("spool: creating segment: %w", err))
		}
		seg = &segment{first: first, f: f}
	}
	buf := make([]byte, 0, total)
	offs := make([]int64, len(batch))
	for i, pa := range batch {
		setSeq(pa.payload, first+uint64(i))
		pa.rec.Seq = first + uint64(i)
		offs[i] = seg.size + int64(len(buf))
		buf = append(buf, frame(pa.payload)...)
	}
	_, err := seg.f.WriteAt(buf, seg.size)
	if err == nil {
		err = seg.f.Sync()
	}
	if err == nil && newSeg {
		err = syncDir(s.o.Dir)
	}
	if err != nil {
		// The bytes' state is unknown after a failed write or fsync: cut
		// them off when possible and never append to this file again.
		_ = seg.f.Truncate(seg.size)
		s.mu.Lock()
		seg.broken = true
		if newSeg {
			s.segs = append(s.segs, seg)
			s.maybeDrop(seg)
		}
		release()
		s.mu.Unlock()
		return fmt.Errorf("spool: writing record: %w", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	release()
	if newSeg {
		if s.active != nil {
			old := s.active
			s.active = nil
			s.maybeDrop(old)
		}
		s.segs = append(s.segs, seg)
		s.active = seg
	}
	for i, pa := range batch {
		e := &entry{seq: pa.rec.Seq, seg: seg, off: offs[i], size: int64(frameHeader + len(pa.payload)),
			arrived: pa.rec.Arrived, scope: pa.rec.Scope, eventID: pa.rec.EventID}
		s.pending = append(s.pending, e)
		s.live++
		s.bytes += e.size
		seg.live++
	}
	seg.size += int64(len(buf))
	s.counts.Spooled += uint64(len(batch))
	if s.closed {
		return nil // durable; the next Open delivers them
	}
	s.poke()
	return nil
}

// read returns e's full record from its segment.
func (s *Spool) read(e *entry) (*Record, error) {
	b := make([]byte, e.size)
	if _, err := e.seg.f.ReadAt(b, e.off); err != nil {
		return nil, fmt.Errorf("spool: reading record %d: %w", e.seq, err)
	}
	p, ok := frameAt(b, 0)
	if !ok {
		return nil, fmt.Errorf("spool: record %d: %w", e.seq, errCorrupt)
	}
	return decodePayload(p, true)
}

// ack records that e is settled: its ack entry is written and fsynced,
// and its segment deleted once every record in it is settled (the active
// one included, when nothing waits: the directory is left empty).
func (s *Spool) ack(e *entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	seg := e.seg
	if seg.ack == nil {
		f, err := os.OpenFile(s.ackPath(seg.first), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("spool: creating ack file: %w", err)
		}
		seg.ack = f
	}
	if _, err := seg.ack.WriteAt(ackEntry(e.seq), seg.ackSize); err != nil {
		return fmt.Errorf("spool: writing ack: %w", err)
	}
	if err := seg.ack.Sync(); err != nil {
		return fmt.Errorf("spool: writing ack: %w", err)
	}
	seg.ackSize += ackSize
	s.settle(e)
	return nil
}

// drop removes a record that can no longer be read, acknowledging it so a
// restart does not try it again.
func (s *Spool) drop(e *entry) {
	s.mu.Lock()
	s.counts.Unreadable++
	s.mu.Unlock()
	if err := s.ack(e); err != nil {
		s.mu.Lock()
		if !e.done {
			s.settle(e)
		}
		s.mu.Unlock()
	}
}

// settle takes e out of the queue (s.mu held).
func (s *Spool) settle(e *entry) {
	e.done = true
	s.live--
	s.bytes -= e.size
	e.seg.live--
	for s.head < len(s.pending) && s.pending[s.head].done {
		s.pending[s.head] = nil
		s.head++
	}
	if s.head > 1024 && s.head > len(s.pending)/2 {
		s.pending = slices.Clip(slices.Clone(s.pending[s.head:]))
		s.head = 0
	}
	if e.seg == s.active && e.seg.live == 0 && s.reserved == 0 {
		s.active = nil // the next append starts a new file
	}
	s.maybeDrop(e.seg)
}

// maybeDrop deletes seg when no record in it waits and appends no longer
// go to it (s.mu held). A failure leaves the files for the next Open.
func (s *Spool) maybeDrop(seg *segment) {
	if seg.live > 0 || seg == s.active {
		return
	}
	s.dropSegment(seg)
	if err := syncDir(s.o.Dir); err != nil {
		s.o.Logger.Warn("spool: syncing the directory after deleting a segment", zap.Error(err))
	}
}

// dropSegment closes and deletes seg's files and forgets it.
func (s *Spool) dropSegment(seg *segment) {
	_ = seg.f.Close()
	if err := os.Remove(s.logPath(seg.first)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.o.Logger.Warn("spool: deleting a settled segment", zap.Error(err))
	}
	if seg.ack != nil {
		_ = seg.ack.Close()
	}
	if err := os.Remove(s.ackPath(seg.first)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.o.Logger.Warn("spool: deleting a settled segment's acks", zap.Error(err))
	}
	s.segs = slices.DeleteFunc(s.segs, func(x *segment) bool { return x == seg })
}

// Stats returns the spool's state now.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Dir: s.o.Dir, Records: s.live, Bytes: s.bytes, MaxBytes: s.o.MaxBytes, Counts: s.counts,
		StoreDown: s.paused.Load()}
	for _, seg := range s.segs {
		st.DiskBytes += seg.size + seg.ackSize
	}
	for _, e := range s.pending[s.head:] {
		if e.done {
			continue
		}
		if st.Oldest.IsZero() {
			st.Oldest = e.arrived
		}
		switch {
		case e.dead:
			st.Dead++
		case e.last == Wait || e.last == Refused:
			st.Waiting++
		}
	}
	return st
}

// Entry is a waiting record as the admin API lists it: no header or body.
type Entry struct {
	Seq       uint64
	Scope     string
	EventID   string
	Arrived   time.Time
	Attempts  int       // tries the upstream did not take
	NotBefore time.Time // zero when it may be tried now
	Last      Outcome   // 0 before the first try
	Dead      bool      // set aside after refusals: tried again only after Retry
}

// List returns up to limit waiting records in arrival order.
func (s *Spool) List(limit int) []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Entry
	for _, e := range s.pending[s.head:] {
		if len(out) >= limit {
			break
		}
		if e.done {
			continue
		}
		out = append(out, e.listed())
	}
	return out
}

// listed is e as List shows it (s.mu held).
func (e *entry) listed() Entry {
	return Entry{Seq: e.seq, Scope: e.scope, EventID: e.eventID, Arrived: e.arrived,
		Attempts: e.attempts, NotBefore: e.notBefore, Last: e.last, Dead: e.dead}
}

// Dir returns the spool's directory.
func (s *Spool) Dir() string { return s.o.Dir }

// Close stops deliveries and appends and closes the files; it does not
// wait for a delivery in progress (its record stays in the spool unless
// it was acknowledged first, and its claim decides what the next try does).
// Records appended and not yet delivered are delivered after the next Open.
func (s *Spool) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	s.c.Close(ErrClosed) // waits for the batch being written
	s.cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return s.closeFiles()
}

// closeFiles closes every file and releases the lock.
func (s *Spool) closeFiles() error {
	for _, seg := range s.segs {
		_ = seg.f.Close()
		if seg.ack != nil {
			_ = seg.ack.Close()
		}
	}
	return unlockDir(s.lock)
}

// syncDir fsyncs a directory, so a file created or deleted in it stays so
// after a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir) //nolint:gosec // the spool directory
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
