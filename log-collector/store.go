package logcollector

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
)

// On disk, each worker has a directory under Config.Dir named after its id (bytes
// outside [A-Za-z0-9_.-], and a leading dot, written as %XX; see workerDirName for
// ids too long for that) holding:
//
//	00000001.jsonl, 00000002.jsonl, …  its records, one JSON object per line, oldest
//	                                   file first; the highest number is being written
//	state.json                         {"stream_id","last_seq","dropped","file","size","earlier"}
//	worker-id                          the id, only when the name is hashed
//
// A batch is appended to the current file and fsynced; then state.json is replaced
// (write, fsync, rename, fsync the directory) with the batch's seq and the file's new
// size; only then is the batch acknowledged. On opening a worker, whatever lies beyond
// the recorded file and size was never acknowledged (a crash between the two writes)
// and is cut off, so the agent's resend of that batch is written exactly once.

const (
	stateFile    = "state.json"
	idFile       = "worker-id"
	dataSuffix   = ".jsonl"
	maxNameBytes = 240 // of a worker's directory name, within file-name limits
	// hashMark separates a hashed name's prefix from its hash; escapeWorkerID never
	// writes it, so a hashed name is never an escaped one.
	hashMark = "~"
)

// workerState is state.json: where a worker's stream stands on disk.
type workerState struct {
	StreamID string `json:"stream_id"`
	LastSeq  uint64 `json:"last_seq"` // highest seq of StreamID written
	Dropped  uint64 `json:"dropped"`  // the agent's dropped count as of LastSeq
	File     int    `json:"file"`     // number of the current data file
	Size     int64  `json:"size"`     // its size after the batch LastSeq
	// Earlier are the streams this one took over from, newest first, at most
	// maxEarlierStreams. A replaced agent that is still running (an old process
	// flushing beside its successor under the same worker id) reconnects; without its
	// last seq it would be welcomed at 0 and write again a batch whose ack it lost.
	Earlier []streamMark `json:"earlier,omitempty"`
}

// streamMark is where a stream other than the current one stood.
type streamMark struct {
	StreamID string `json:"stream_id"`
	LastSeq  uint64 `json:"last_seq"`
	Dropped  uint64 `json:"dropped"`
}

// maxEarlierStreams bounds workerState.Earlier: a few overlapping agent processes.
const maxEarlierStreams = 8

// switchStream makes id the current stream, remembering the one it replaces and
// taking up where id stood if it streamed before. The caller holds the worker's mu.
func (st *workerState) switchStream(id string) {
	if st.StreamID == id {
		return
	}
	earlier := make([]streamMark, 0, len(st.Earlier)+1)
	if st.StreamID != "" {
		earlier = append(earlier, streamMark{st.StreamID, st.LastSeq, st.Dropped})
	}
	st.StreamID, st.LastSeq, st.Dropped = id, 0, 0
	for _, m := range st.Earlier {
		if m.StreamID == id {
			st.LastSeq, st.Dropped = m.LastSeq, m.Dropped
			continue
		}
		earlier = append(earlier, m)
	}
	st.Earlier = earlier[:min(len(earlier), maxEarlierStreams)]
}

// store holds every worker's files under one directory.
type store struct {
	dir          string
	maxFileBytes int64
	maxFiles     int

	mu      sync.Mutex
	workers map[string]*workerLog // opened once; removed only with their directory (trimToBudget)

	// maxTotalBytes bounds all workers' files together (0: no bound); trimMu makes
	// one trimToBudget run at a time.
	maxTotalBytes int64
	trimMu        sync.Mutex

	now func() time.Time // time.Now; tests move it on
	// syncDir fsyncs the logs directory after a worker's directory is made in it;
	// a test may fail it.
	syncDir func(dir string) error
}

func newStore(dir string, maxFileBytes int64, maxFiles int) (*store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("log directory: %w", err)
	}
	return &store{dir: dir, maxFileBytes: maxFileBytes, maxFiles: maxFiles, workers: map[string]*workerLog{}, now: time.Now, syncDir: syncDir}, nil
}

// goneAfter is how long a worker must have had no stream, and written nothing, before
// trimToBudget may take its current file, and with it the worker's directory. Worker
// ids are pod names: a worker replaced by a rollout never comes back, and its current
// file would otherwise stay for good. Time without a stream counts from the stream's
// end or, for a worker not streaming since the collector started, from the start
// (workerLog.detachedAt): a live worker that has logged nothing for an hour has not
// had the chance to reconnect to a collector that has just restarted.
const goneAfter = time.Hour

// goneLocked says whether w is gone: no stream since before goneBefore, and its
// current file, last written at written, written before it too. The caller holds w.mu.
func (w *workerLog) goneLocked(written, goneBefore time.Time) bool {
	return w.owner == nil && !w.detachedAt.After(goneBefore) && written.Before(goneBefore)
}

// stillGoneLocked is goneLocked with the current file stat'ed now: a stream may have
// come, written and gone since the file was listed. The caller holds w.mu.
func (w *workerLog) stillGoneLocked(goneBefore time.Time) bool {
	fi, err := os.Stat(w.dataPath(w.state.File))
	return err == nil && w.goneLocked(fi.ModTime(), goneBefore)
}

// trimToBudget deletes the oldest data files, whichever worker's they are, until the
// files of all workers fit maxTotalBytes, and returns how many it deleted. MaxFiles
// bounds each worker, not the directory: worker ids are pod names, a rollout brings a
// new set, and the files of workers long gone would fill the disk. Rotated-out files
// go in the order they were last written. A current file goes in that order too, but
// only a gone worker's (no stream and nothing written for goneAfter), and it takes the
// worker's directory with it: state.json points at the file. Otherwise the bound can
// be exceeded by up to one file per worker. A worker whose directory cannot be read is
// left out, its files neither counted nor deleted, and named in err: the others are
// still trimmed.
func (s *store) trimToBudget() (deleted int, removed []string, err error) {
	if s.maxTotalBytes <= 0 {
		return 0, nil, nil
	}
	s.trimMu.Lock()
	defer s.trimMu.Unlock()
	ids, err := s.workerIDs()
	if err != nil {
		return 0, nil, err
	}
	type oldFile struct {
		w       *workerLog
		n       int
		size    int64
		modTime time.Time
	}
	var total int64
	var old []oldFile
	sizes := map[*workerLog]map[int]int64{} // what total counts, by worker and file
	goneBefore := s.now().Add(-goneAfter)
	var unreadable []error // such a worker's files are neither counted nor trimmed; the others still are
	for _, id := range ids {
		w, err := s.existing(id)
		if err != nil {
			unreadable = append(unreadable, err)
			continue
		}
		if w == nil {
			continue // removed by hand since it was listed
		}
		w.mu.Lock()
		sizes[w] = map[int]int64{}
		for _, n := range w.files {
			fi, err := os.Stat(w.dataPath(n))
			if err != nil {
				continue // deleted meanwhile, or unreadable: not counted
			}
			total += fi.Size()
			sizes[w][n] = fi.Size()
			if n != w.state.File || w.goneLocked(fi.ModTime(), goneBefore) {
				old = append(old, oldFile{w, n, fi.Size(), fi.ModTime()})
			}
		}
		w.mu.Unlock()
	}
	slices.SortFunc(old, func(a, b oldFile) int { // oldest first
		return cmp.Or(a.modTime.Compare(b.modTime), strings.Compare(a.w.dir, b.w.dir), cmp.Compare(a.n, b.n))
	})
	for _, f := range old {
		if total <= s.maxTotalBytes {
			break
		}
		f.w.mu.Lock()
		i, gone := slices.Index(f.w.files, f.n), false
		switch {
		case i < 0:
		case f.n != f.w.state.File:
			if err := os.Remove(f.w.dataPath(f.n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				f.w.mu.Unlock()
				return deleted, removed, err
			}
			f.w.files = slices.Delete(f.w.files, i, i+1)
			total -= f.size
			deleted++
		case f.w.stillGoneLocked(goneBefore): // gone when listed, and still
			if err := os.RemoveAll(f.w.dir); err != nil {
				f.w.mu.Unlock()
				return deleted, removed, err
			}
			for _, n := range f.w.files {
				total -= sizes[f.w][n]
			}
			deleted += len(f.w.files)
			f.w.files, f.w.removed, gone = nil, true, true
		}
		f.w.mu.Unlock()
		if gone {
			s.forget(f.w)
			removed = append(removed, f.w.id)
		}
	}
	return deleted, removed, errors.Join(unreadable...)
}

// forget drops w, whose directory trimToBudget removed, so that the next use of its
// id opens the worker afresh. w.removed is set under w.mu before.
func (s *store) forget(w *workerLog) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.workers[w.id] == w {
		delete(s.workers, w.id)
	}
}

// workerLog is one worker's files. Its mu is held for a whole batch (write, fsync,
// state), so batches of a worker are written one at a time and in order.
type workerLog struct {
	id  string
	dir string

	mu    sync.Mutex
	state workerState // the persisted state, plus StreamID switched by a new hello
	files []int       // data files on disk, ascending; the last is state.File
	file  *os.File    // state.File opened for appending; nil until the first write
	owner *ingestConn // the connection streaming for this worker; the newest wins
	// detachedAt is when owner last became nil: the end of its last stream, or when
	// the worker was opened (at the latest, the collector's start).
	detachedAt time.Time
	// removed: trimToBudget deleted the directory of this gone worker. Whoever finds
	// it set after taking mu lets it go (store.forget) and opens the worker again.
	removed bool

	// stateOnDisk: state.json exists. Until it does, a restart would take every byte
	// in the files as acknowledged, so appendBatch writes it before the first batch.
	stateOnDisk bool
	// dirUnsynced: state.json was renamed into place but the directory's fsync failed,
	// so a power cut could still bring the old one back. Until a directory fsync
	// works, nothing up to state.LastSeq is vouched for (settle).
	dirUnsynced bool
	// unvouched are the batches written while dirUnsynced: in the file and named in
	// state.json, not yet counted as written (settle vouches for them).
	unvouched vouched
	// syncDir fsyncs the worker's directory; a test may fail it.
	syncDir func(dir string) error
	// named: the logs directory was fsynced after this worker's directory was made
	// (store.open, under store.mu).
	named bool
}

// vouched counts batches whose state became durable, and their records.
type vouched struct{ batches, records int }

// settle makes state.json's last rename durable if its directory fsync failed, so
// that the acknowledged seq (a duplicate's ack, a welcome) is one a power cut keeps.
// It returns the batches that vouches for. The caller holds w.mu.
func (w *workerLog) settle() (vouched, error) {
	if !w.dirUnsynced {
		return vouched{}, nil
	}
	if err := w.syncDir(w.dir); err != nil {
		return vouched{}, fmt.Errorf("state: %w", err)
	}
	w.dirUnsynced = false
	v := w.unvouched
	w.unvouched = vouched{}
	return v, nil
}

// escapeWorkerID makes a worker id safe as a directory name.
func escapeWorkerID(id string) string {
	var b strings.Builder
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || (c == '.' && i > 0) {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// workerDirName names the directory of a worker whose id frame.CheckWorkerID takes:
// the escaped id (escapeWorkerID) if that fits maxNameBytes; else, since an id of
// 256 bytes escapes to as many as 768, the escaped id cut to fit, hashMark and a hash
// of the id (hashed), which leaves the name recognisable and tells ids apart. A
// hashed name does not give the id back: the directory keeps it in idFile.
func workerDirName(id string) (name string, hashed bool) {
	name = escapeWorkerID(id)
	if len(name) <= maxNameBytes {
		return name, false
	}
	sum := sha256.Sum256([]byte(id))
	tail := hashMark + hex.EncodeToString(sum[:16])
	cut := maxNameBytes - len(tail)
	// Not inside a %XX: '%' only ever starts one.
	if i := strings.LastIndexByte(name[cut-2:cut], '%'); i >= 0 {
		cut -= 2 - i
	}
	return name[:cut] + tail, true
}

// worker returns the worker's log, opening (and recovering) it on first use and
// making its directory if it has none.
func (s *store) worker(id string) (*workerLog, error) { return s.open(id, true) }

// existing returns the worker's log if the worker has a directory, else nil. It never
// makes one: a query or a trim racing trimToBudget's removal must not bring the
// directory back empty.
func (s *store) existing(id string) (*workerLog, error) { return s.open(id, false) }

func (s *store) open(id string, create bool) (*workerLog, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.workers[id]
	if w == nil {
		name, hashed := workerDirName(id)
		var err error
		if w, err = openWorker(filepath.Join(s.dir, name), id, hashed, create); err != nil {
			return nil, fmt.Errorf("open logs of worker %s: %w", id, err)
		}
		if w == nil {
			return nil, nil
		}
		w.detachedAt = s.now()
		s.workers[id] = w
	}
	if create && !w.named {
		// The directory's own name must survive a power cut before a batch in it is
		// acknowledged: fsyncing the files and state.json inside does not make the
		// entry in the logs directory durable. Once per worker and process, so a
		// directory made by a run that crashed before this fsync gets it too.
		if err := s.syncDir(s.dir); err != nil {
			return nil, fmt.Errorf("open logs of worker %s: logs directory: %w", id, err)
		}
		w.named = true
	}
	return w, nil
}

// workerIDs lists the workers with a directory, sorted.
func (s *store) workerIDs() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		id, err := url.PathUnescape(e.Name())
		if strings.Contains(e.Name(), hashMark) {
			// Unreadable, or not yet written (checkIDFile): the worker is not
			// listed until it is next opened, by a stream or a query naming it.
			var b []byte
			b, err = os.ReadFile(filepath.Join(s.dir, e.Name(), idFile))
			id = string(b)
		}
		if name, _ := workerDirName(id); err == nil && name == e.Name() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

func (s *store) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, w := range s.workers {
		w.mu.Lock()
		if w.file != nil {
			errs = append(errs, w.file.Close())
			w.file = nil
		}
		w.mu.Unlock()
	}
	return errors.Join(errs...)
}

// openWorker opens the worker whose directory is dir, named by workerDirName
// (hashed: the name does not give the id back); without create, a missing directory
// gives nil.
func openWorker(dir, id string, hashed, create bool) (*workerLog, error) {
	if create {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	w := &workerLog{id: id, dir: dir, syncDir: syncDir}
	entries, err := os.ReadDir(dir)
	if !create && errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if hashed {
		if err := w.checkIDFile(); err != nil {
			return nil, err
		}
	}
	for _, e := range entries {
		if n, ok := dataFileNumber(e.Name()); ok {
			w.files = append(w.files, n)
		}
	}
	slices.Sort(w.files)
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// A new worker, or one whose state was removed by hand: continue its newest
		// file as it is; every seq is new.
		if len(w.files) > 0 {
			w.state.File = w.files[len(w.files)-1]
			if fi, err := os.Stat(w.dataPath(w.state.File)); err == nil {
				w.state.Size = fi.Size()
			}
		} else {
			w.state.File = 1
		}
		return w, nil
	case err != nil:
		return nil, err
	}
	if err := json.Unmarshal(b, &w.state); err != nil || w.state.File < 1 || w.state.Size < 0 {
		return nil, fmt.Errorf("%s is damaged (%v): move it away to start the worker afresh", filepath.Join(dir, stateFile), err)
	}
	w.stateOnDisk = true
	// Cut off what was written after the last acknowledged batch.
	for len(w.files) > 0 && w.files[len(w.files)-1] > w.state.File {
		n := w.files[len(w.files)-1]
		if err := os.Remove(w.dataPath(n)); err != nil {
			return nil, err
		}
		w.files = w.files[:len(w.files)-1]
	}
	fi, err := os.Stat(w.dataPath(w.state.File))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		w.state.Size = 0
	case err != nil:
		return nil, err
	case fi.Size() > w.state.Size:
		if err := os.Truncate(w.dataPath(w.state.File), w.state.Size); err != nil {
			return nil, err
		}
	case fi.Size() < w.state.Size:
		w.state.Size = fi.Size() // shortened by hand; carry on from what is there
	}
	return w, nil
}

// checkIDFile makes sure that w's hashed directory is w's and names w in idFile,
// which workerIDs reads. A new directory gets the file before any record is written;
// one whose first stream failed before that (a crash) gets it on opening.
func (w *workerLog) checkIDFile() error {
	b, err := os.ReadFile(filepath.Join(w.dir, idFile))
	switch {
	case err == nil && string(b) != w.id: // a hash collision, or a file edited by hand
		return fmt.Errorf("%s names another worker, %q", filepath.Join(w.dir, idFile), b)
	case errors.Is(err, fs.ErrNotExist):
		_, err = writeFileRenamed(w.dir, idFile, []byte(w.id), w.syncDir)
	}
	return err
}

func dataFileNumber(name string) (int, bool) {
	base, ok := strings.CutSuffix(name, dataSuffix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(base)
	return n, err == nil && n > 0
}

func (w *workerLog) dataPath(n int) string {
	return filepath.Join(w.dir, fmt.Sprintf("%08d%s", n, dataSuffix))
}

// batchData is a batch's lines, whose size is known before they are written.
type batchData interface {
	Size() int64
	io.WriterTo
}

// appendBatch writes data (whole lines) as batch seq of the current stream, of
// records records, makes it durable and records it in state.json. It returns the
// batches that became durable: this one, and any written earlier while the directory
// fsync failed. The caller holds w.mu. On error the batch must not be acknowledged;
// nothing is recorded unless state.json was renamed into place (dirUnsynced).
func (w *workerLog) appendBatch(data batchData, seq, dropped uint64, records int, maxFileBytes int64, maxFiles int) (vouched, error) {
	if !w.stateOnDisk {
		// A new worker (or one whose state was removed): record where its files end
		// before adding to them, so that a crash before this batch's state is written
		// cuts the batch off on restart instead of keeping it unacknowledged.
		if _, err := writeStateRenamed(w.dir, w.state, w.syncDir); err != nil {
			return vouched{}, fmt.Errorf("state: %w", err)
		}
		w.stateOnDisk = true
	}
	size := data.Size()
	if w.state.Size > 0 && w.state.Size+size > maxFileBytes {
		if err := w.rotate(maxFiles); err != nil {
			return vouched{}, fmt.Errorf("rotate: %w", err)
		}
	}
	if w.file == nil {
		f, err := os.OpenFile(w.dataPath(w.state.File), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return vouched{}, err
		}
		// The file may run past the acknowledged size: a failed batch whose cut did not
		// succeed either. Appending after it would put the next batch beyond what
		// state.json records, where queries never read and a restart cuts it off.
		if err := cutTo(f, w.state.Size); err != nil {
			f.Close()
			return vouched{}, fmt.Errorf("cutting a failed batch off: %w", err)
		}
		w.file = f
		if !slices.Contains(w.files, w.state.File) {
			w.files = append(w.files, w.state.File)
			if err := w.syncDir(w.dir); err != nil {
				return vouched{}, err
			}
		}
	}
	// Streamed through a buffer: the lines may be several times the frame.
	out := bufio.NewWriterSize(w.file, int(min(size, maxWriteBuffer)))
	n, err := data.WriteTo(out)
	if err == nil {
		err = out.Flush()
	}
	if err == nil && n != size {
		err = fmt.Errorf("wrote %d bytes of a batch of %d", n, size)
	}
	if err != nil {
		w.dropBatch() // the resend writes it whole
		return vouched{}, fmt.Errorf("write: %w", err)
	}
	if err := w.file.Sync(); err != nil {
		w.dropBatch()
		return vouched{}, fmt.Errorf("fsync: %w", err)
	}
	next := w.state
	next.LastSeq, next.Dropped, next.Size = seq, max(dropped, w.state.Dropped), w.state.Size+size
	if renamed, err := writeStateRenamed(w.dir, next, w.syncDir); err != nil {
		if renamed {
			// state.json may already name this batch (only the directory's fsync
			// failed): cutting the data off would lose it after a restart. Keep both;
			// the batch is not acknowledged, and its resend is taken as a duplicate,
			// acknowledged only once the directory's fsync works (settle).
			w.state = next
			w.dirUnsynced = true
			w.unvouched.batches++
			w.unvouched.records += records
		} else {
			w.dropBatch()
		}
		return vouched{}, fmt.Errorf("state: %w", err)
	}
	w.state = next
	w.dirUnsynced = false // this fsync of the directory covers the earlier rename too
	v := w.unvouched
	w.unvouched = vouched{}
	v.batches++
	v.records += records
	return v, nil
}

// maxWriteBuffer bounds the buffer a batch is written through.
const maxWriteBuffer = 64 << 10

// dropBatch cuts a batch that failed off the current file and closes it; the next
// batch opens the file again and, should this cut have failed too, cuts it then.
func (w *workerLog) dropBatch() {
	_ = w.file.Truncate(w.state.Size)
	_ = w.file.Close()
	w.file = nil
}

// cutTo truncates f to size when it is longer.
func cutTo(f *os.File, size int64) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > size {
		return f.Truncate(size)
	}
	return nil
}

// rotate starts the next data file and deletes the oldest beyond maxFiles.
func (w *workerLog) rotate(maxFiles int) error {
	// The file may run past the acknowledged size (a failed batch whose cut failed as
	// well): cut it now. Once it is not the current file, queries read it whole and a
	// restart no longer cuts it, and the batch, resent, would be stored twice.
	f := w.file
	w.file = nil
	if f == nil {
		var err error
		if f, err = os.OpenFile(w.dataPath(w.state.File), os.O_WRONLY, 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if f != nil {
		err := cutTo(f, w.state.Size)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("cutting a failed batch off before rotating: %w", err)
		}
	}
	w.state.File++
	w.state.Size = 0
	f, err := os.OpenFile(w.dataPath(w.state.File), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	w.file = f
	w.files = append(w.files, w.state.File)
	for len(w.files) > maxFiles {
		if err := os.Remove(w.dataPath(w.files[0])); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		w.files = w.files[1:]
	}
	return w.syncDir(w.dir)
}

// writeStateRenamed replaces state.json (a temporary file, fsync, rename, directory
// fsync with syncDir) and says whether the new one was renamed into place, which a
// failed directory fsync leaves uncertain on disk.
func writeStateRenamed(dir string, st workerState, syncDir func(string) error) (renamed bool, err error) {
	b, err := json.Marshal(st)
	if err != nil {
		return false, err
	}
	return writeFileRenamed(dir, stateFile, b, syncDir)
}

// writeFileRenamed replaces the file name in dir with b as writeStateRenamed does.
func writeFileRenamed(dir, name string, b []byte, syncDir func(string) error) (renamed bool, err error) {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return false, err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return false, err
	}
	return true, syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// scan calls fn with each acknowledged record of the worker, oldest first. Records
// written while it runs may or may not be seen; fn must not keep line.
func (w *workerLog) scan(ctx context.Context, fn func(line []byte)) error {
	w.mu.Lock()
	files := slices.Clone(w.files)
	current, size := w.state.File, w.state.Size
	w.mu.Unlock()
	for _, n := range files {
		f, err := os.Open(w.dataPath(n))
		if errors.Is(err, fs.ErrNotExist) {
			continue // rotated away meanwhile
		}
		if err != nil {
			return err
		}
		var r io.Reader = ctxReader{ctx, f}
		if n == current {
			r = io.LimitReader(r, size)
		}
		err = scanLines(bufio.NewReaderSize(r, 64<<10), fn)
		f.Close()
		if err != nil {
			return fmt.Errorf("read %s: %w", w.dataPath(n), err)
		}
	}
	return nil
}

// ctxReader stops reading once ctx is done: checked every read, each up to 64 KiB.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func scanLines(r *bufio.Reader, fn func([]byte)) error {
	var long []byte
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long, line...)
			continue
		}
		if long != nil {
			line = append(long, line...)
			long = nil
		}
		if err == nil {
			fn(line[:len(line)-1])
			continue
		}
		if errors.Is(err, io.EOF) {
			return nil // a last line without its newline is not a whole record
		}
		return err
	}
}

// A record's time is after Go's zero time (0001-01-01T00:00:00Z, which the query's
// ordering reads as no time) and before the year 10000, which RFC 3339 cannot write.
var (
	minRecordTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	maxRecordTime = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// recordTime reads a record's "time": RFC 3339 text, or Unix seconds as a number. A
// time outside those bounds (1e300, 1e999, year 0000) counts as no time: a record's
// worker is not ours to vouch for, and unchecked, a number past int64 became whatever
// the platform makes of the conversion (year 292277026304 on amd64): the most recent
// of every record, and one any since= passed.
func recordTime(r gjson.Result) (time.Time, bool) {
	var t time.Time
	switch r.Type {
	case gjson.String:
		var err error
		if t, err = time.Parse(time.RFC3339Nano, r.Str); err != nil {
			return time.Time{}, false
		}
	case gjson.Number:
		// Bounded before the conversion; written so that NaN fails too.
		if !(r.Num > float64(minRecordTime.Unix()) && r.Num < float64(maxRecordTime.Unix())) {
			return time.Time{}, false
		}
		sec := math.Floor(r.Num)
		t = time.Unix(int64(sec), int64((r.Num-sec)*1e9))
	default:
		return time.Time{}, false
	}
	if !t.After(minRecordTime) || !t.Before(maxRecordTime) {
		return time.Time{}, false
	}
	return t, true
}
