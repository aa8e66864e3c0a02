package dispatcher

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"
)

// journalFile is the bbolt file under Config.DataDir.
const journalFile = "journal.db"

var (
	tasksBucket = []byte("tasks")
	// answeredBucket indexes the answers in tasksBucket by finish time: each key is an
	// 8-byte big-endian finish time in unix nanoseconds followed by the task id, each
	// value empty. The janitor reads it from the oldest end, so that it looks at
	// expired answers only. An entry may outlive its answer (the id accepted anew, a
	// damaged record deleted); the janitor deletes it then too.
	answeredBucket = []byte("answered")
)

// answeredKey is the index key of an answer finished at finished.
func answeredKey(finished int64, id []byte) []byte {
	k := make([]byte, 8+len(id))
	binary.BigEndian.PutUint64(k, uint64(finished))
	copy(k[8:], id)
	return k
}

// errDataDirInUse is returned when another dispatcher holds the journal's file lock.
var errDataDirInUse = errors.New("another dispatcher is using this data dir")

// journal keeps asynchronously accepted tasks (202) on disk until they have an answer,
// and their answers for the task retention, so that a dispatcher that crashes runs
// them again when it starts and still answers GET /tasks/{id}.
//
// Each value is an 8-byte big-endian finish time in unix nanoseconds (0 while the
// task is pending) followed by the JSON of a journalEntry: the janitor reads only
// the prefix.
type journal struct {
	db *bolt.DB
	// retention, log, and the failing-disk handling: writeErrors counts failed writes
	// of answers; a failed batch stays queued, answerable from memory, and is written
	// again after a backoff (retryAfter), so that a disk full for a while loses nothing.
	journalOptions

	// Completions are written by one goroutine, many per transaction: finish runs
	// under the hub's lock and must not wait for a disk. Guarded by mu.
	mu      sync.Mutex
	pending []journalEntry
	writing []journalEntry // the batch being committed, until it is on disk; for get
	wake    chan struct{}  // capacity 1: there is something in pending

	closeOnce sync.Once
	stop      chan struct{}
	stopped   chan struct{}
	closeErr  error
}

// journalEntry is one task as the journal stores it.
type journalEntry struct {
	ID       string `json:"id"`
	Label    string `json:"label"`
	TaskType string `json:"task_type"`
	Params   []byte `json:"params,omitempty"`
	Created  int64  `json:"created"`  // unix ns
	Deadline int64  `json:"deadline"` // unix ns, absolute: kept across restarts
	// Fingerprint is taskFingerprint of the task's label, type and parameters, so that
	// a resubmission of the id with other content is refused across restarts too.
	// Zero in records of builds before it: any content matches those.
	Fingerprint uint64 `json:"fingerprint,omitempty"`

	// Set once the task has its answer.
	Finished   int64           `json:"finished,omitempty"` // unix ns
	Status     string          `json:"status,omitempty"`
	HTTPStatus int             `json:"http_status,omitempty"`
	Error      string          `json:"error,omitempty"`
	Result     json.RawMessage `json:"result,omitempty"`
	WorkerID   string          `json:"worker_id,omitempty"`
	// Attempts is, for an answer, the task's starts; for a pending task, the starts it
	// is charged with from earlier dispatchers (see hub.recover). Released: the last
	// dispatcher let the pending task go at a graceful shutdown and wrote its starts
	// exactly; otherwise it may have died with the task running.
	Attempts  int   `json:"attempts,omitempty"`
	Released  bool  `json:"released,omitempty"`
	LabelMiss bool  `json:"label_miss,omitempty"`
	QueueNS   int64 `json:"queue_ns,omitempty"`
	LoadNS    int64 `json:"load_ns,omitempty"`
	RunNS     int64 `json:"run_ns,omitempty"`
}

// journalOptions are what openJournal needs beyond the data dir.
type journalOptions struct {
	retention, lockTimeout time.Duration
	log                    zerolog.Logger
	writeErrors            prometheus.Counter     // nil: not counted
	retryAfter             func() backoff.BackOff // nil: answersRetry
	// writeFault, when set, fails the journal's writes (accept and answers) with its
	// error: tests inject a failing disk with it.
	writeFault func() error
	// now is the clock the answers' writer reads to drop expired answers; nil:
	// time.Now.
	now func() time.Time
}

// answersRetry paces the writes of answers again after a failed one: soon at first, at
// most every 10 s while the disk stays full, for as long as it does.
func answersRetry() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 10 * time.Second
	return b
}

// openJournal opens (creating) the journal in dir. A file locked by another process
// fails after lockTimeout with errDataDirInUse.
func openJournal(dir string, o journalOptions) (*journal, error) {
	lockTimeout := o.lockTimeout
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	path := filepath.Join(dir, journalFile)
	err := checkJournal(path, lockTimeout)
	var db *bolt.DB
	if err == nil {
		db, err = openWritable(path, lockTimeout)
	}
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s is locked (waited %v); stop the other dispatcher or give this one its own --data-dir", errDataDirInUse, path, lockTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("open journal %s: %w", path, err)
	}
	// A lone producer should not wait long for company; concurrent 202s still share
	// a commit, because a batch forms while the previous one is being synced.
	db.MaxBatchDelay = time.Millisecond
	if err := db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(tasksBucket); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(answeredBucket) // filled by load for older journals
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("journal %s: %w", path, err)
	}
	if o.retryAfter == nil {
		o.retryAfter = answersRetry
	}
	if o.now == nil {
		o.now = time.Now
	}
	j := &journal{db: db, journalOptions: o, wake: make(chan struct{}, 1),
		stop: make(chan struct{}), stopped: make(chan struct{})}
	go j.writeCompletions()
	return j, nil
}

// openWritable opens the journal for writing. Its free-list rebuild panics, in a
// goroutine of bbolt's, on damage that checkJournal did not find. That panic is not recovered here:
// the rebuild's goroutine goes on walking pages after the open has failed, and a
// recovered start crashed on it all the same, sometimes, after logging the error.
func openWritable(path string, lockTimeout time.Duration) (*bolt.DB, error) {
	return bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout, FreelistType: bolt.FreelistMapType, NoFreelistSync: true})
}

// journalDamaged is the error for a journal that cannot be used: it says what to do.
func journalDamaged(path string, what any) error {
	return fmt.Errorf("journal %s is damaged (%v): move it aside to start without it (its pending tasks are lost) or restore it from a backup", path, what)
}

// checkJournal reads an existing journal through once, read-only, checking that each
// bucket's keys are in order, before it is opened for writing. Opening for writing
// rebuilds the free list (NoFreelistSync) by walking every page, in a goroutine of
// bbolt's own where a page past the file is a fault nothing can recover, and panics on
// any inconsistency (a key out of order); here the same damage is an error that says
// what to do.
func checkJournal(path string, lockTimeout time.Duration) (err error) {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) || (err == nil && st.Size() == 0) {
		return nil // bbolt creates it
	}
	if err != nil {
		return fmt.Errorf("journal %s: %w", path, err)
	}
	damaged := func(what any) error { return journalDamaged(path, what) }
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true)) // a read past a truncated file
	defer func() {
		if r := recover(); r != nil {
			err = damaged(r)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: lockTimeout})
	var pathErr *fs.PathError
	if errors.Is(err, bolt.ErrTimeout) || errors.As(err, &pathErr) {
		return err // locked, or not ours to read: the file may be fine
	}
	if err != nil {
		return damaged(err) // not a bbolt file, or a header bbolt refuses
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		if tx.Size() > st.Size() {
			return damaged(fmt.Sprintf("%d bytes, its pages need %d", st.Size(), tx.Size()))
		}
		// Every page read here, where a read past the file is a panic recovered above,
		// and every bucket's keys checked to be in order: a key out of order (or a page
		// referenced twice, which repeats its keys) reads through, but the read-write
		// open's free-list rebuild panics on it in a goroutine of bbolt's. bbolt's own
		// tx.Check is no help here: it rebuilds the free list the same way, and its
		// goroutine went on reading the transaction after the panic had closed it.
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			var prev []byte
			return b.ForEach(func(k, v []byte) error {
				if prev != nil && bytes.Compare(prev, k) >= 0 {
					return damaged(fmt.Sprintf("bucket %s: key %q after %q, out of order", name, k, prev))
				}
				prev = append(prev[:0], k...)
				_ = finishedAt(v) // touch the value's pages
				return nil
			})
		})
	})
}

func encodeEntry(e *journalEntry) ([]byte, error) {
	var buf bytes.Buffer
	var prefix [8]byte
	binary.BigEndian.PutUint64(prefix[:], uint64(e.Finished))
	buf.Write(prefix[:])
	if err := json.NewEncoder(&buf).Encode(e); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func decodeEntry(v []byte) (journalEntry, error) {
	var e journalEntry
	if len(v) < 8 {
		return e, fmt.Errorf("journal record of %d bytes is too short", len(v))
	}
	err := json.Unmarshal(v[8:], &e)
	return e, err
}

// finishedAt is the finish time stored in a value's prefix; zero while pending.
func finishedAt(v []byte) int64 {
	if len(v) < 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(v[:8]))
}

func (j *journal) expired(finished int64, now time.Time) bool {
	return finished != 0 && now.UnixNano()-finished >= int64(j.retention)
}

// accept stores a new pending task and returns once it is synced to disk, sharing
// the sync with concurrent callers. An id the journal already holds (pending, or
// answered within the retention) is not overwritten: created is false and prev is
// the stored entry. A pending record whose run has answered, the answer still waiting
// for the disk and expired meanwhile, is overwritten as an expired answer would be:
// nothing runs that record any more, and the writer drops that answer.
func (j *journal) accept(e *journalEntry, now time.Time) (prev *journalEntry, created bool, err error) {
	v, err := encodeEntry(e)
	if err != nil {
		return nil, false, err
	}
	// An answer not on disk yet first: the record there still reads pending, and the
	// task would be admitted to run again. Looked at before the disk, as get does, so
	// that an answer written in between is found there.
	if a, ok := j.unwrittenAnswer(e.ID, now); ok {
		return &a, false, nil
	}
	key := []byte(e.ID)
	err = j.db.Batch(func(tx *bolt.Tx) error {
		// Batch may run this twice: set the results from scratch each time.
		prev, created = nil, false
		if j.writeFault != nil {
			if err := j.writeFault(); err != nil {
				return err
			}
		}
		b := tx.Bucket(tasksBucket)
		if old := b.Get(key); old != nil && !j.expired(finishedAt(old), now) {
			p, err := decodeEntry(old)
			if err == nil && !(p.Finished == 0 && j.answeredAndExpired(p.ID, p.Created, now)) {
				prev = &p
				return nil
			}
			if err != nil {
				// A damaged record holds nothing to answer with: the task is accepted anew
				// rather than refused under that id for good.
				j.log.Error().Str("task_id", e.ID).Msg("journal: unreadable record replaced")
			}
		}
		created = true
		return b.Put(key, v)
	})
	return prev, created, err
}

// get returns the answered entry under id, if the journal holds one within the
// retention.
func (j *journal) get(id string, now time.Time) (e journalEntry, ok bool, err error) {
	if e, ok := j.unwrittenAnswer(id, now); ok {
		return e, true, nil
	}
	err = j.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(tasksBucket).Get([]byte(id))
		fin := finishedAt(v)
		if v == nil || fin == 0 || j.expired(fin, now) {
			return nil
		}
		e, err = decodeEntry(v)
		ok = err == nil
		return err
	})
	return e, ok, err
}

// unwrittenAnswer returns the newest answer under id that is not on disk yet (queued for the
// writer, or being written), if one is within the retention.
func (j *journal) unwrittenAnswer(id string, now time.Time) (journalEntry, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, q := range [][]journalEntry{j.pending, j.writing} {
		for i := len(q) - 1; i >= 0; i-- {
			if q[i].ID == id && !j.expired(q[i].Finished, now) {
				return q[i], true
			}
		}
	}
	return journalEntry{}, false
}

// answeredAndExpired says whether the run of id created at created has an answer
// waiting for the disk whose retention is over.
func (j *journal) answeredAndExpired(id string, created int64, now time.Time) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, q := range [][]journalEntry{j.pending, j.writing} {
		for i := range q {
			if q[i].ID == id && q[i].Created == created && j.expired(q[i].Finished, now) {
				return true
			}
		}
	}
	return false
}

// errKept rolls back a forget that was called off.
var errKept = errors.New("journal record kept")

// forget deletes the pending record under id, a task accepted into the journal that
// the hub then refused, if ok agrees. ok runs inside the write transaction, so no
// other write to the journal comes between its answer and the delete. An answered
// record is never deleted: another submission of the id ran and answered meanwhile.
func (j *journal) forget(id string, ok func() bool) error {
	err := j.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(tasksBucket)
		v := b.Get([]byte(id))
		if v == nil || finishedAt(v) != 0 || !ok() {
			return errKept
		}
		return b.Delete([]byte(id))
	})
	if errors.Is(err, errKept) {
		return nil
	}
	return err
}

// complete queues a task's answer for the writer; it never blocks on the disk. An
// answer lost in a crash before it is written makes the task run again on restart.
func (j *journal) complete(e journalEntry) {
	j.mu.Lock()
	j.pending = append(j.pending, e)
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// unwritten is how many answers wait for the disk.
func (j *journal) unwritten() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.pending) + len(j.writing)
}

// writeCompletions writes queued answers, all that accumulated in one transaction,
// until close; it writes what is left before it returns. A batch that fails to be
// written goes back to the front of the queue and is tried again after a backoff:
// dropping it would make its tasks run again after a restart, or read as failed,
// although their producers may have their results. Tried once more at close, what
// still fails is lost as a crash would lose it.
func (j *journal) writeCompletions() {
	defer close(j.stopped)
	var (
		batch []journalEntry
		retry backoff.BackOff // non-nil while the last write failed
		timer *time.Timer
		again <-chan time.Time
	)
	for {
		stopping := false
		select {
		case <-j.wake:
			if retry != nil {
				continue // new answers wait for the retry, with the failed ones
			}
		case <-again:
		case <-j.stop:
			stopping = true
		}
		j.mu.Lock()
		batch, j.pending = j.pending, batch[:0]
		j.writing = batch
		j.mu.Unlock()
		if len(batch) == 0 {
			if stopping {
				return
			}
			continue
		}
		err := j.writeAnswers(batch)
		j.mu.Lock()
		j.writing = nil
		if err != nil {
			// Back in front of any answer queued since, so that get keeps finding the
			// newest one last.
			j.pending = append(batch, j.pending...)
			batch = nil // now pending's
		}
		j.mu.Unlock()
		clear(batch)
		switch {
		case err == nil:
			if retry != nil {
				j.log.Info().Int("tasks", len(batch)).Msg("journal: answers written again")
				retry, again = nil, nil
			}
		case stopping:
			j.log.Error().Err(err).Int("tasks", j.unwritten()).Msg("journal: answers not written at close; those tasks run again after a restart")
		default:
			if j.writeErrors != nil {
				j.writeErrors.Inc()
			}
			if retry == nil {
				retry = j.retryAfter()
				j.log.Error().Err(err).Int("tasks", len(j.pending)).Msg("journal: answers not written; kept in memory and tried again")
			}
			wait := retry.NextBackOff()
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			again = timer.C
		}
		if stopping {
			return
		}
	}
}

// writeAnswers writes a batch of answers in one transaction. An answer replaces only
// the pending record of its own run (the same Created): a record the id was accepted
// anew under (after the retention) belongs to another run, and an answer delayed by a
// failing disk must not turn it into an old answer. An answer whose retention is over
// is not written: its record, if still its run's, is deleted as the janitor would.
// An answer that cannot be encoded (no JSON result gets this far unchecked, so it
// should never happen) is logged and left out: it would fail every retry and hold up
// the rest.
func (j *journal) writeAnswers(batch []journalEntry) error {
	now := j.now()
	values := make([][]byte, len(batch))
	for i := range batch {
		if j.expired(batch[i].Finished, now) {
			continue
		}
		v, err := encodeEntry(&batch[i])
		if err != nil {
			j.log.Error().Err(err).Str("task_id", batch[i].ID).Msg("journal: answer cannot be encoded; the task runs again after a restart")
			continue
		}
		values[i] = v
	}
	return j.db.Update(func(tx *bolt.Tx) error {
		if j.writeFault != nil {
			if err := j.writeFault(); err != nil {
				return err
			}
		}
		b, index := tx.Bucket(tasksBucket), tx.Bucket(answeredBucket)
		for i := range batch {
			e := &batch[i]
			key := []byte(e.ID)
			old := b.Get(key)
			if old == nil || finishedAt(old) != 0 || createdAt(old) != e.Created {
				continue // answered already, or another run's record (or none)
			}
			if values[i] == nil {
				if j.expired(e.Finished, now) {
					if err := b.Delete(key); err != nil {
						return err
					}
				}
				continue
			}
			if err := b.Put(key, values[i]); err != nil {
				return err
			}
			if err := index.Put(answeredKey(e.Finished, key), []byte{}); err != nil {
				return err
			}
		}
		return nil
	})
}

// createdField precedes Created in a record's JSON. It cannot occur earlier, inside
// a string (a quote there is escaped) or in the base64 of the parameters; the result,
// which may hold anything, comes after it.
var createdField = []byte(`,"created":`)

// createdAt is the Created of a stored record; -1 for one that does not decode. The
// answers' writer reads it for every answer, so it looks for the field rather than
// decode the record (and its parameters).
func createdAt(v []byte) int64 {
	if len(v) < 8 {
		return -1
	}
	if i := bytes.Index(v[8:], createdField); i >= 0 {
		rest := v[8+i+len(createdField):]
		end := bytes.IndexAny(rest, ",}")
		if end > 0 {
			if n, err := strconv.ParseInt(string(rest[:end]), 10, 64); err == nil {
				return n
			}
		}
	}
	var e struct {
		Created int64 `json:"created"`
	}
	if json.Unmarshal(v[8:], &e) != nil {
		return -1
	}
	return e.Created
}

// loaded is what the journal holds at start, as load reads it.
type loaded struct {
	pending []journalEntry // every pending task, in no order
	// answered are the newest answers within the retention that fit the bounds,
	// newest first; droppedAt is the finish time (unix ns) of the newest one left
	// out, zero when none was.
	answered  []journalEntry
	droppedAt int64
}

// load returns every pending task, and the newest answers within the retention, at
// most maxAnswers of them holding at most maxBytes (entryBytes; the first is kept
// whatever its size, as the retention keeps one): the journal may hold many times
// what memory is allowed, and the rest stay on disk for GET /tasks/{id}. Answers are
// decoded one at a time from the index, newest first, so the start's memory is the
// bound, not the journal. It also indexes the answers the index lacks (every answer of
// a journal written by a build without it), and deletes records it cannot decode.
func (j *journal) load(now time.Time, maxAnswers int, maxBytes int64) (l loaded, err error) {
	var damaged, unindexed [][]byte
	// Pending tasks: the whole journal is walked, but answers are not decoded.
	err = j.db.View(func(tx *bolt.Tx) error {
		index := tx.Bucket(answeredBucket)
		return tx.Bucket(tasksBucket).ForEach(func(k, v []byte) error {
			if fin := finishedAt(v); fin != 0 {
				if index.Get(answeredKey(fin, k)) == nil {
					unindexed = append(unindexed, answeredKey(fin, k))
				}
				return nil
			}
			e, err := decodeEntry(v)
			if err != nil {
				// One damaged record must not keep the dispatcher from starting; it is
				// deleted below, since the sweep, which reads only answers, never
				// takes it.
				j.log.Error().Err(err).Str("task_id", string(k)).Msg("journal: unreadable record deleted")
				damaged = append(damaged, bytes.Clone(k))
				return nil
			}
			l.pending = append(l.pending, e)
			return nil
		})
	})
	if err == nil && len(unindexed) > 0 {
		// In order: bbolt inserts into one node until the commit splits it, and keys
		// out of order made that quadratic (5 s for 50,000 answers).
		slices.SortFunc(unindexed, bytes.Compare)
		j.log.Info().Int("answers", len(unindexed)).Msg("journal: answers indexed for the janitor")
		err = j.db.Update(func(tx *bolt.Tx) error {
			for _, k := range unindexed {
				if err := tx.Bucket(answeredBucket).Put(k, []byte{}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err != nil {
		return loaded{}, err
	}
	// Answers, newest first, until the retention or the bounds end them.
	var size int64
	err = j.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(tasksBucket)
		c := tx.Bucket(answeredBucket).Cursor()
		for k, _ := c.Last(); k != nil; k, _ = c.Prev() {
			if len(k) < 8 {
				continue
			}
			fin := int64(binary.BigEndian.Uint64(k))
			if j.expired(fin, now) {
				return nil
			}
			v := b.Get(k[8:])
			if v == nil || finishedAt(v) != fin {
				continue // the id was accepted anew: the entry waits for the janitor
			}
			e, err := decodeEntry(v)
			if err != nil {
				j.log.Error().Err(err).Str("task_id", string(k[8:])).Msg("journal: unreadable record deleted")
				damaged = append(damaged, bytes.Clone(k[8:]))
				continue
			}
			n := entryBytes(&e)
			if len(l.answered) > 0 && (len(l.answered) >= maxAnswers || size+n > maxBytes) {
				l.droppedAt = fin
				return nil
			}
			l.answered = append(l.answered, e)
			size += n
		}
		return nil
	})
	if err == nil && len(damaged) > 0 {
		err = j.db.Update(func(tx *bolt.Tx) error {
			for _, k := range damaged {
				if err := tx.Bucket(tasksBucket).Delete(k); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err != nil {
		return loaded{}, err
	}
	return l, nil
}

// rewritePending writes entries over the pending records of their own runs (the same
// Created), in one transaction: the starts a recovery charges, or a shutdown's count
// of them. A record answered or accepted anew meanwhile is left alone.
func (j *journal) rewritePending(entries []journalEntry) error {
	if len(entries) == 0 {
		return nil
	}
	return j.db.Update(func(tx *bolt.Tx) error {
		if j.writeFault != nil {
			if err := j.writeFault(); err != nil {
				return err
			}
		}
		b := tx.Bucket(tasksBucket)
		for i := range entries {
			e := &entries[i]
			key := []byte(e.ID)
			if old := b.Get(key); old == nil || finishedAt(old) != 0 || createdAt(old) != e.Created {
				continue
			}
			v, err := encodeEntry(e)
			if err != nil {
				return err
			}
			if err := b.Put(key, v); err != nil {
				return err
			}
		}
		return nil
	})
}

// markReleased sets, on the pending record of each entry's run, the entry's Attempts
// and Released, keeping the rest of the record (its parameters): a graceful shutdown
// says how many times the tasks it let go were started.
func (j *journal) markReleased(entries []journalEntry) error {
	if len(entries) == 0 {
		return nil
	}
	return j.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(tasksBucket)
		for _, r := range entries {
			key := []byte(r.ID)
			old := b.Get(key)
			if old == nil || finishedAt(old) != 0 {
				continue
			}
			e, err := decodeEntry(old)
			if err != nil || e.Created != r.Created {
				continue
			}
			e.Attempts, e.Released = r.Attempts, true
			v, err := encodeEntry(&e)
			if err != nil {
				return err
			}
			if err := b.Put(key, v); err != nil {
				return err
			}
		}
		return nil
	})
}

// sweep deletes the answers whose retention is over, oldest first, in transactions of
// at most limit, until it finds no more or the journal closes; it returns how many it
// deleted. It reads the index of answers by finish time from its oldest end, so it
// looks at expired answers only, however many pending or recent ones the journal
// holds. A sweep that finds nothing writes nothing.
func (j *journal) sweep(now time.Time, limit int) (deleted int, err error) {
	for {
		select {
		case <-j.stop:
			return deleted, nil
		default:
		}
		var expired [][]byte // index keys
		err := j.db.View(func(tx *bolt.Tx) error {
			c := tx.Bucket(answeredBucket).Cursor()
			for k, _ := c.First(); k != nil && len(expired) < limit; k, _ = c.Next() {
				if len(k) >= 8 && !j.expired(int64(binary.BigEndian.Uint64(k)), now) {
					break
				}
				expired = append(expired, bytes.Clone(k))
			}
			return nil
		})
		if err != nil || len(expired) == 0 {
			return deleted, err
		}
		n := 0
		err = j.db.Update(func(tx *bolt.Tx) error {
			n = 0
			b, index := tx.Bucket(tasksBucket), tx.Bucket(answeredBucket)
			for _, k := range expired {
				// The record goes only if it still holds that answer: the id may have been
				// accepted anew since.
				if len(k) >= 8 {
					id := k[8:]
					if v := b.Get(id); v != nil && finishedAt(v) == int64(binary.BigEndian.Uint64(k)) {
						if err := b.Delete(id); err != nil {
							return err
						}
						n++
					}
				}
				if err := index.Delete(k); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return deleted, err
		}
		deleted += n
		if len(expired) < limit {
			return deleted, nil
		}
	}
}

// close writes the queued answers and closes the file. Idempotent.
func (j *journal) close() error {
	j.closeOnce.Do(func() {
		close(j.stop)
		<-j.stopped
		j.closeErr = j.db.Close()
	})
	return j.closeErr
}
