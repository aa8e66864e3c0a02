package batch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/rs/zerolog"
	"github.com/schollz/progressbar/v3"
)

// Summary is what a run did.
type Summary struct {
	JobID string `json:"job_id"`
	// StartLine is the first line this run read (1 for a fresh job).
	StartLine int64 `json:"start_line"`
	// Lines is how many input lines this run wrote, completed or rejected.
	Lines     int64 `json:"lines"`
	Completed int64 `json:"completed"`
	Rejected  int64 `json:"rejected"`
	// LabelMisses counts completed tasks that had to load their label, as the
	// dispatcher answered (label_miss): the fleet's label loads for this job.
	LabelMisses int64 `json:"label_misses"`
	// Issued counts submissions, reissues included; Reissued those after a timeout or a
	// failed answer.
	Issued   int64 `json:"issued"`
	Reissued int64 `json:"reissued"`
	// PeakWindowBytes is the most memory the window's lines held (MaxWindowBytes).
	PeakWindowBytes int64   `json:"peak_window_bytes"`
	Seconds         float64 `json:"seconds"`
	PerSec          float64 `json:"items_per_second"`
	Order           Order   `json:"order"`
}

// item is one input line on its way to the output. Owned by the run loop; attempt
// goroutines get copies of what they need.
type item struct {
	line int64 // 1-based
	end  int64 // input offset just after the line
	raw  []byte
	task lineTask

	issued   bool // taken from the look-ahead pool
	attempts int  // issues that timed out or got a failed answer
	failures int  // failed answers the dispatcher keeps: each moves the item to a fresh task id
	// setbacks counts the answers that were not its result (failed, or a run past its
	// deadline): each doubles the wait before the item is issued again.
	setbacks int
	lastErr  string
	seq      int // the current attempt; reports of other attempts are stale
	inFlight bool
	issuedAt time.Time
	// notBefore holds a reissue after a failed answer back until then (RetryDelay).
	notBefore time.Time
	cancel    context.CancelFunc
	// proxyOnlySince is when the line's run of bare 502s (a proxy's, no answer) began:
	// the issue of the first attempt so answered. Zero once anything else answers it.
	proxyOnlySince time.Time

	done bool
	miss bool   // completed on a worker that loaded its label; counted when written
	out  []byte // the output line, newline included
	rej  []byte // the rejected file's line, when rejected

	held int64 // bytes counted in job.held for it
}

// size is what the item holds in memory now.
func (it *item) size() int64 {
	return int64(len(it.raw) + len(it.task.params) + len(it.task.id) + len(it.out) + len(it.rej))
}

// report is an attempt's outcome: the HTTP status and body, or err when no answer came.
type report struct {
	it     *item
	seq    int
	status int
	body   []byte
	err    error
	// retryAfter is the answer's Retry-After, zero when it has none.
	retryAfter time.Duration
}

type job struct {
	cfg       Config
	log       zerolog.Logger
	runTask   string
	cp        checkpoint
	jobID     string // set once by open, before the control server starts
	in        *os.File
	lr        *lineReader
	eof       bool
	out, rej  *os.File
	outW      *bufio.Writer
	rejW      *bufio.Writer
	written   checkpoint // progress written (maybe not yet durable); cp is the durable one
	win       []*item    // lines from the oldest unwritten one, in order
	held      int64      // bytes the window's items hold (MaxWindowBytes)
	peakHeld  int64      // the most held has been (Summary.PeakWindowBytes)
	fifo      []*item    // the look-ahead pool in line order (issued ones skipped lazily)
	byLabel   map[string][]*item
	pending   int    // items in the pool
	active    []pass // passes being issued in turn (label order)
	turn      int    // index in active of the label issued last
	retry     []*item
	inflight  map[*item]struct{}
	running   int // attempt goroutines alive (bounded by Concurrency)
	results   chan report
	syncErr   error     // a failed fsync of the output or rejected file: no checkpoint after it
	pauseTill time.Time // after "no answer" from the dispatcher: issue nothing until then
	pausing   bool
	bo        *backoff.ExponentialBackOff
	bar       *progressbar.ProgressBar
	fatal     error
	// warnedConflict: a 409 was logged; the input changed, and one warning says so.
	warnedConflict bool
	// answered: something answered the job's HTTP requests in this run, so the URL was
	// right. A host that stops resolving or a certificate that stops being trusted
	// later is a Service being recreated or a certificate being rotated, waited out as
	// no answer, not a wrong --dispatcher.
	answered bool
	// outCreated, rejCreated and cpCreated: this run made the file, so a run refused or
	// stopped before it writes a line removes it (undo) rather than leave an empty file
	// that looks like a job's.
	outCreated, rejCreated, cpCreated bool

	// Read by the control server; written by the loop (atomics) or the server.
	timeout        atomic.Int64 // nanoseconds
	timeoutChanged chan struct{}
	st             stats
}

// stats are counters the control server reads while the loop writes them.
type stats struct {
	lines, completed, rejected, misses, issued, reissued atomic.Int64
	inFlight, window, windowBytes                        atomic.Int64
	nextLine                                             atomic.Int64
}

// ErrConfig wraps Run's errors for an invalid Config: bad usage, not a failed job.
var ErrConfig = errors.New("batch config")

// Run runs the job in cfg until every input line is written, ctx ends, or an error
// stops it. It resumes from the checkpoint when there is one. On a stop the written
// results are checkpointed, so running it again carries on.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	ownClient := cfg.HTTPClient == nil
	cfg = cfg.WithDefaults()
	if ownClient {
		// Nobody else can close the job's keep-alive connections, and neither the
		// client nor the dispatcher times them out.
		defer cfg.HTTPClient.CloseIdleConnections()
	}
	if err := cfg.Validate(); err != nil {
		return Summary{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	j := &job{
		cfg:            cfg,
		log:            cfg.Logger.With().Str("component", "batch").Logger(),
		runTask:        strings.TrimSuffix(cfg.DispatcherURL, "/") + "/run-task",
		byLabel:        map[string][]*item{},
		inflight:       map[*item]struct{}{},
		results:        make(chan report, cfg.Concurrency),
		timeoutChanged: make(chan struct{}, 1),
		bo:             &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 5 * time.Second},
	}
	j.bo.Reset()
	j.timeout.Store(int64(cfg.WorkTimeout))
	// closeFiles is deferred before anything can fail: undo removes the files it
	// created while it still holds their locks.
	defer j.closeFiles()
	if err := j.open(); err != nil {
		return Summary{}, j.undo(err)
	}
	stopControl, err := j.startControl()
	if err != nil {
		return Summary{}, j.undo(err)
	}
	defer stopControl()
	if cfg.Progress != nil {
		remaining, err := countLines(cfg.Input, j.cp.InputOffset)
		if err != nil {
			return Summary{}, j.undo(err)
		}
		j.bar = newBar(cfg.Progress, remaining)
	}
	start := time.Now()
	j.log.Info().Str("job_id", j.cp.JobID).Int64("start_line", j.cp.Lines+1).Str("order", string(cfg.Order)).Msg("batch job started")
	err = j.loop(ctx)
	if cerr := j.checkpoint(); cerr != nil {
		// A failed checkpoint is the news whatever stopped the job: reported as only
		// "interrupted" (context.Canceled), it tells the caller the written lines are
		// checkpointed when they are not.
		if err != nil {
			cerr = fmt.Errorf("%w (while stopping: %v)", cerr, err)
		}
		err = cerr
	}
	if err != nil {
		err = j.undo(err)
	}
	if j.bar != nil {
		if err == nil {
			_ = j.bar.Finish() // Finish fills the bar: only for a job that wrote every line
		}
		fmt.Fprintln(cfg.Progress)
	}
	s := Summary{
		JobID: j.cp.JobID, StartLine: j.written.Lines - j.st.lines.Load() + 1,
		Lines: j.st.lines.Load(), Completed: j.st.completed.Load(), Rejected: j.st.rejected.Load(),
		LabelMisses: j.st.misses.Load(), Issued: j.st.issued.Load(), Reissued: j.st.reissued.Load(),
		PeakWindowBytes: j.peakHeld, Seconds: time.Since(start).Seconds(), Order: cfg.Order,
	}
	if s.Seconds > 0 {
		s.PerSec = float64(s.Lines) / s.Seconds
	}
	j.log.Info().Int64("lines", s.Lines).Int64("rejected", s.Rejected).Int64("label_misses", s.LabelMisses).Float64("seconds", s.Seconds).Err(err).Msg("batch job ended")
	return s, err
}

// checkResume refuses to resume cp with files or a reading of lines other than the
// job's that wrote it.
func (j *job) checkResume(cp checkpoint) error {
	for _, f := range []struct{ flag, recorded, given string }{
		{"--output", cp.Output, j.cfg.Output}, {"--rejected", cp.Rejected, j.cfg.Rejected},
	} {
		if f.recorded != "" && !samePath(f.recorded, f.given) {
			return fmt.Errorf("checkpoint %s belongs to the job that wrote %s, not %s (%s): resuming would cut that file back; give the same %s, or another --checkpoint",
				j.cfg.Checkpoint, f.recorded, f.given, f.flag, f.flag)
		}
	}
	if cp.Shape != nil {
		if d := cp.Shape.differs(shapeOf(j.cfg)); len(d) > 0 {
			return fmt.Errorf("checkpoint %s: this run reads lines otherwise than the job it resumes (%s): its tasks would reuse that job's task ids, which the dispatcher answers with the earlier tasks' results; give the same settings, or remove %s, %s and %s to start over",
				j.cfg.Checkpoint, strings.Join(d, ", "), j.cfg.Output, j.cfg.Rejected, j.cfg.Checkpoint)
		}
	}
	return nil
}

// open locks the output and rejected files, reads the checkpoint (writing a fresh one
// for a new job), cuts the files back to what it records, and seeks the input.
func (j *job) open() error {
	// The input is opened first: a job that cannot read it leaves nothing behind.
	var err error
	if j.in, err = os.Open(j.cfg.Input); err != nil {
		return fmt.Errorf("input: %w", err)
	}
	fi, err := j.in.Stat()
	if err != nil {
		return fmt.Errorf("input: %w", err)
	}
	// The locks come before the checkpoint is read: two fresh runs that both read "no
	// checkpoint" each wrote one, the second's job id over the first's under its running
	// job; and a run that read a checkpoint the job's last run then moved past would cut
	// that run's lines back.
	if j.out, j.outCreated, err = j.openLocked(j.cfg.Output); err != nil {
		return err
	}
	if j.rej, j.rejCreated, err = j.openLocked(j.cfg.Rejected); err != nil {
		return err
	}
	cp, ok, err := loadCheckpoint(j.cfg.Checkpoint)
	if err != nil {
		return err
	}
	if !ok {
		// A fresh job must not clobber results it cannot account for.
		for _, f := range []*os.File{j.out, j.rej} {
			if size, err := fileSize(f); err != nil {
				return err
			} else if size > 0 {
				return fmt.Errorf("%s exists and there is no checkpoint %s: remove it to start over", f.Name(), j.cfg.Checkpoint)
			}
		}
		cp = checkpoint{JobID: newJobID(), InputHeadBytes: min(fi.Size(), inputHeadBytes), Shape: shapeOf(j.cfg)}
		if cp.InputHead, err = inputHead(j.in, cp.InputHeadBytes); err != nil {
			return fmt.Errorf("input: %w", err)
		}
		if cp.Output, err = filepath.Abs(j.cfg.Output); err != nil {
			return fmt.Errorf("output: %w", err)
		}
		if cp.Rejected, err = filepath.Abs(j.cfg.Rejected); err != nil {
			return fmt.Errorf("rejected: %w", err)
		}
		// The checkpoint comes first: from now on the files are ours to truncate. There
		// was none under the locks, so whatever save leaves there is this run's.
		j.cpCreated = true
		if err := cp.save(j.cfg.Checkpoint, j.cfg.syncDir); err != nil {
			return err
		}
	}
	j.cp, j.written, j.jobID = cp, cp, cp.JobID
	if fi.Size() < cp.InputOffset || fi.Size() < cp.InputHeadBytes {
		return fmt.Errorf("input %s is %d bytes, shorter than when the job started (checkpoint %s): it is not the input this job ran on", j.cfg.Input, fi.Size(), j.cfg.Checkpoint)
	}
	if ok {
		if err := j.checkResume(cp); err != nil {
			return err
		}
	}
	if ok && cp.InputHead != "" {
		head, err := inputHead(j.in, cp.InputHeadBytes)
		if err != nil {
			return fmt.Errorf("input: %w", err)
		}
		if head != cp.InputHead {
			return fmt.Errorf("input %s begins with other bytes than when the job started (checkpoint %s): it is not the input this job ran on; to run it, remove %s, %s and %s or choose another --output",
				j.cfg.Input, j.cfg.Checkpoint, j.cfg.Output, j.cfg.Rejected, j.cfg.Checkpoint)
		}
	}
	if _, err := j.in.Seek(cp.InputOffset, io.SeekStart); err != nil {
		return fmt.Errorf("input: %w", err)
	}
	j.lr = newLineReader(j.in, cp.InputOffset, j.cfg.MaxLineBytes)
	for _, f := range []struct {
		file *os.File
		want int64
	}{{j.out, cp.OutputSize}, {j.rej, cp.RejectedSize}} {
		if size, err := fileSize(f.file); err != nil {
			return err
		} else if size < f.want {
			return fmt.Errorf("%s is %d bytes, shorter than the checkpoint's %d: it was changed outside the job", f.file.Name(), size, f.want)
		}
	}
	if ok {
		// Nothing is cut back until every file agrees with the checkpoint.
		if err := j.checkLineEnds(cp, fi.Size()); err != nil {
			return err
		}
	}
	if err := cutBack(j.out, cp.OutputSize, j.cfg.syncDir); err != nil {
		return err
	}
	if err := cutBack(j.rej, cp.RejectedSize, j.cfg.syncDir); err != nil {
		return err
	}
	j.outW = bufio.NewWriterSize(j.out, 256<<10)
	j.rejW = bufio.NewWriterSize(j.rej, 64<<10)
	j.st.nextLine.Store(cp.Lines + 1)
	return nil
}

// errLocked is lockFile's answer when another process holds the lock.
var errLocked = errors.New("locked")

// openLocked opens path for writing, creating it when it does not exist (created),
// and holds its lock until the file is closed. The lock is taken before anything reads
// the checkpoint or cuts a file back: a second run of a running job (a cron job
// overlapping the last one) would cut the files under the first one and interleave
// their lines.
//
// A run that is refused removes the files it created, and only while it holds their
// locks (undo): a file it created but another run locked first is that run's. So a
// file is created exclusively, never opened as "maybe new", and after locking it the
// run checks that the path still leads to it: a run that opened it just before a
// refused run removed it would otherwise lock, and write, a file no name leads to.
func (j *job) openLocked(path string) (f *os.File, created bool, err error) {
	for {
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		created = err == nil
		if errors.Is(err, fs.ErrExist) {
			f, err = os.OpenFile(path, os.O_RDWR, 0)
			if errors.Is(err, fs.ErrNotExist) {
				if fi, lerr := os.Lstat(path); lerr != nil || fi.Mode()&fs.ModeSymlink == 0 {
					continue // removed since by a refused run: create it
				}
				// A link to a file not there yet, which O_EXCL refuses: its target is
				// created as before, and not counted as this run's.
				f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
			}
		}
		if err != nil {
			return nil, false, err
		}
		if j.cfg.opened != nil {
			j.cfg.opened(path)
		}
		if err = lockFile(f); errors.Is(err, errLocked) {
			err = fmt.Errorf("%s is in use by another batch job (a run of this job still going?): wait for it or stop it", path)
		} else if err != nil {
			// Some file systems (some network mounts) refuse locks; say which file.
			err = fmt.Errorf("locking %s: %w", path, err)
		}
		if err != nil {
			f.Close()
			return nil, false, err
		}
		held, err := f.Stat()
		if err == nil {
			var now os.FileInfo
			if now, err = os.Stat(path); err == nil && os.SameFile(held, now) {
				return f, created, nil
			}
		}
		f.Close()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, false, fmt.Errorf("reading %s: %w", path, err)
		}
		// Removed (and maybe created again) since it was opened: open what is there now.
	}
}

// undo removes what this run created, when it ends with err having written no line:
// the output and rejected files (empty, and still locked by it, so no other run is
// using them), and a fresh job's checkpoint unless tasks went out under its job id,
// which the next run then reuses to attach to them. It returns err, with what it could
// not remove.
func (j *job) undo(err error) error {
	if j.st.lines.Load() > 0 {
		return err
	}
	var left []string
	for _, c := range []struct {
		f       *os.File
		created bool
	}{{j.out, j.outCreated}, {j.rej, j.rejCreated}} {
		if c.f == nil || !c.created {
			continue
		}
		if size, serr := fileSize(c.f); serr != nil || size > 0 {
			continue // bytes this run did not write (or a size unknown): not ours to remove
		}
		if rerr := os.Remove(c.f.Name()); rerr != nil {
			left = append(left, rerr.Error())
		}
	}
	if j.cpCreated && j.st.issued.Load() == 0 {
		if rerr := os.Remove(j.cfg.Checkpoint); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			left = append(left, rerr.Error())
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("%w (and this run's files are left: %s)", err, strings.Join(left, "; "))
	}
	return err
}

// fileSize is f's size now.
func fileSize(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", f.Name(), err)
	}
	return fi.Size(), nil
}

// cutBack cuts f back to size: anything beyond was written after the last checkpoint
// and will be written again. The file's directory is fsynced before anything is
// written: the checkpoint will count the file's bytes, and a power cut must not then
// lose the file's name (the checkpoint's own directory fsync covers its directory,
// which --output and --rejected need not share). Every start syncs, not only the one
// that creates the file: a crash may have come between a creation and its sync.
func cutBack(f *os.File, size int64, syncDir func(dir string) error) error {
	if err := syncDir(filepath.Dir(f.Name())); err != nil {
		return fmt.Errorf("syncing the directory of %s: %w", f.Name(), err)
	}
	if err := f.Truncate(size); err != nil {
		return err
	}
	_, err := f.Seek(size, io.SeekStart)
	return err
}

// checkLineEnds checks, before a resume cuts anything back, that the checkpoint's
// offsets fall where lines end: after a newline in the input (or at its end, a last
// line without one), in the output and in the rejected file; and that the output's
// last line is the checkpoint's last line. A checkpoint whose numbers passed
// decodeCheckpoint but are not the job's (damaged, or edited) would otherwise cut the
// files mid-line, or send lines under other lines' task ids, which the dispatcher
// answers with those lines' results. Only the last line is read, not the files.
func (j *job) checkLineEnds(cp checkpoint, inputSize int64) error {
	changed := fmt.Sprintf("it or the checkpoint %s was changed outside the job; to start over, remove the checkpoint, %s and %s",
		j.cfg.Checkpoint, j.cfg.Output, j.cfg.Rejected)
	for _, f := range []struct {
		file *os.File
		end  int64
		eof  bool // whether the file may end there without a newline
	}{{j.in, cp.InputOffset, cp.InputOffset == inputSize}, {j.out, cp.OutputSize, false}, {j.rej, cp.RejectedSize, false}} {
		if f.end == 0 || f.eof {
			continue
		}
		b := []byte{0}
		if _, err := f.file.ReadAt(b, f.end-1); err != nil {
			return fmt.Errorf("reading %s: %w", f.file.Name(), err)
		}
		if b[0] != '\n' {
			return fmt.Errorf("%s: the checkpoint says a line ends at byte %d, but none does: %s", f.file.Name(), f.end, changed)
		}
	}
	if cp.Lines == 0 {
		return nil
	}
	n, err := lastLineNumber(j.out, cp.OutputSize)
	if err != nil {
		return fmt.Errorf("%s: reading the last line the checkpoint counts: %w", j.out.Name(), err)
	}
	if n != cp.Lines {
		return fmt.Errorf("%s: the checkpoint counts %d lines, but the last it counts is line %d: %s", j.out.Name(), cp.Lines, n, changed)
	}
	return nil
}

// lastLineNumber reads the "line" of the output line that ends at end (with its
// newline). Output lines begin {"line":n, as json.Marshal writes outputLine.
func lastLineNumber(f *os.File, end int64) (int64, error) {
	// Back from the newline that ends the line to the one before it, in chunks.
	start := int64(0)
	buf := make([]byte, 64<<10)
	for pos := end - 1; pos > 0 && start == 0; {
		n := min(pos, int64(len(buf)))
		if _, err := f.ReadAt(buf[:n], pos-n); err != nil {
			return 0, err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			start = pos - n + int64(i) + 1
		}
		pos -= n
	}
	head := buf[:min(end-start, 40)]
	if _, err := f.ReadAt(head, start); err != nil {
		return 0, err
	}
	digits, ok := bytes.CutPrefix(head, []byte(`{"line":`))
	if i := bytes.IndexByte(digits, ','); ok && i > 0 {
		if n, err := strconv.ParseInt(string(digits[:i]), 10, 64); err == nil {
			return n, nil
		}
	}
	return 0, fmt.Errorf("the line at byte %d does not begin as an output line: %q", start, head)
}

func (j *job) closeFiles() {
	for _, f := range []*os.File{j.in, j.out, j.rej} {
		if f != nil {
			f.Close()
		}
	}
}

// loop is the one goroutine that owns the window, the pool and the files.
func (j *job) loop(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	cpTick := time.NewTicker(j.cfg.CheckpointInterval)
	defer cpTick.Stop()
	for {
		if err := j.fill(); err != nil {
			return j.stop(err)
		}
		if err := j.flush(); err != nil {
			return j.stop(err)
		}
		if j.fatal != nil {
			return j.stop(j.fatal)
		}
		if j.eof && len(j.win) == 0 {
			return nil
		}
		now := time.Now()
		j.issue(ctx, now)
		j.st.inFlight.Store(int64(len(j.inflight)))
		j.st.window.Store(int64(len(j.win)))
		j.st.windowBytes.Store(j.held)
		timer.Reset(j.nextWake(now))
		select {
		case r := <-j.results:
			j.handle(r)
			j.drainResults() // take every report ready before deciding again
		case now := <-timer.C:
			j.drainResults() // an answer in hand is not timed out
			j.expire(now)
		case <-j.timeoutChanged:
			j.drainResults()
			j.expire(time.Now())
		case <-cpTick.C:
			if err := j.checkpoint(); err != nil {
				return j.stop(err)
			}
		case <-ctx.Done():
			return j.stop(ctx.Err())
		}
	}
}

// drainResults handles every report that is ready, without waiting.
func (j *job) drainResults() {
	for {
		select {
		case r := <-j.results:
			j.handle(r)
		default:
			return
		}
	}
}

// stop cancels what is in flight and waits for the attempt goroutines, keeping the
// results that arrive meanwhile, and returns err.
func (j *job) stop(err error) error {
	for it := range j.inflight {
		it.cancel()
	}
	for j.running > 0 {
		j.handle(<-j.results)
	}
	if ferr := j.flush(); err == nil {
		err = ferr
	}
	return err
}

// nextWake is how long until the earliest in-flight deadline or the end of a pause.
func (j *job) nextWake(now time.Time) time.Duration {
	wake := time.Hour
	timeout := time.Duration(j.timeout.Load())
	for it := range j.inflight {
		wake = min(wake, it.issuedAt.Add(timeout).Sub(now))
	}
	if j.pausing {
		wake = min(wake, j.pauseTill.Sub(now))
	}
	for _, it := range j.retry {
		if it.notBefore.After(now) { // one that is ready waits for a slot, not a time
			wake = min(wake, it.notBefore.Sub(now))
		}
	}
	return max(wake, 0)
}

// fill reads lines while the look-ahead pool and the window have room: in lines, and
// in bytes (a line's size is known once it is read, so the last one may pass the bound).
func (j *job) fill() error {
	for !j.eof && j.pending < j.cfg.Lookahead && len(j.win) < j.cfg.MaxOutOfOrder && (len(j.win) == 0 || j.held < j.cfg.MaxWindowBytes) {
		raw, end, err := j.lr.next()
		if err == io.EOF {
			j.eof = true
			break
		}
		it := &item{line: j.st.nextLine.Load() + int64(len(j.win)), end: end}
		j.win = append(j.win, it)
		var tooLong *errLineTooLong
		if errors.As(err, &tooLong) {
			j.reject(it, err.Error())
			continue
		}
		if err != nil {
			return fmt.Errorf("reading input: %w", err)
		}
		it.raw = bytes.Clone(raw)
		if it.task, err = parseLine(raw, j.cfg.Fields, j.cfg.DefaultTaskType); err != nil {
			j.reject(it, err.Error())
			continue
		}
		j.account(it)
		j.pending++
		j.fifo = append(j.fifo, it)
		if j.cfg.Order == OrderLabel {
			j.byLabel[it.task.label] = append(j.byLabel[it.task.label], it)
		}
	}
	return nil
}

// pick takes the next item to issue: reissues first, then the pool. In label order
// it runs passes: a pass issues the lines of one label read so far, in line order,
// and ends when they are all issued; LabelsAtOnce passes run in turn, so the fleet
// serves a few labels at a time and loads each once per pass. A new pass starts with
// the label of the oldest line not issued. Lines read during a pass wait for the
// label's next pass instead of trickling out one by one, which would degrade to file
// order; passes are finite, so no line waits for more than one round.
func (j *job) pick(now time.Time) *item {
	for i, it := range j.retry {
		if !now.Before(it.notBefore) {
			j.retry = slices.Delete(j.retry, i, i+1)
			return it
		}
	}
	if j.pending == 0 {
		return nil
	}
	for j.fifo[0].issued {
		j.fifo = j.fifo[1:]
	}
	if j.cfg.Order == OrderFile {
		it := j.fifo[0]
		j.fifo = j.fifo[1:]
		it.issued = true
		j.pending--
		return it
	}
	j.active = slices.DeleteFunc(j.active, func(p pass) bool {
		q := j.byLabel[p.label]
		return len(q) == 0 || q[0].line > p.last
	})
	if len(j.active) < j.cfg.LabelsAtOnce && len(j.byLabel) > len(j.active) {
		lastRead := j.fifo[len(j.fifo)-1].line
		for _, it := range j.fifo {
			if len(j.active) == j.cfg.LabelsAtOnce {
				break
			}
			if !it.issued && !slices.ContainsFunc(j.active, func(p pass) bool { return p.label == it.task.label }) {
				j.active = append(j.active, pass{label: it.task.label, last: lastRead})
			}
		}
	}
	j.turn = (j.turn + 1) % len(j.active) // never empty: the oldest line starts a pass
	return j.popLabel(j.active[j.turn].label)
}

// pickHead takes the oldest unwritten line when it waits to be issued: with the window
// full in bytes, its answer is the one that lets the window drain.
func (j *job) pickHead(now time.Time) *item {
	if len(j.win) == 0 {
		return nil
	}
	h := j.win[0]
	if h.done || h.inFlight {
		return nil
	}
	if i := slices.Index(j.retry, h); i >= 0 {
		if now.Before(h.notBefore) {
			return nil
		}
		j.retry = slices.Delete(j.retry, i, i+1)
		return h
	}
	if h.issued {
		return nil // not reached: issued, neither done nor in flight, is in retry
	}
	if j.cfg.Order == OrderLabel {
		// The oldest unwritten line is the first of its label's queue (queues are in
		// line order, and hold only lines not issued).
		return j.popLabel(h.task.label)
	}
	h.issued = true // the pool's fifo skips it
	j.pending--
	return h
}

// pass is a label being issued, up to its last line read when the pass began.
type pass struct {
	label string
	last  int64
}

func (j *job) popLabel(label string) *item {
	q := j.byLabel[label]
	if len(q) == 0 {
		return nil
	}
	it := q[0]
	if len(q) == 1 {
		delete(j.byLabel, label)
	} else {
		j.byLabel[label] = q[1:]
	}
	it.issued = true
	j.pending--
	return it
}

// issue starts attempts while there are free slots and nothing pauses issuing.
func (j *job) issue(ctx context.Context, now time.Time) {
	if j.pausing {
		if now.Before(j.pauseTill) {
			return
		}
		j.pausing = false
	}
	for j.running < j.cfg.Concurrency {
		var it *item
		if j.held < j.cfg.MaxWindowBytes {
			it = j.pick(now)
		} else {
			// Any other line's answer would add to the window; the oldest's lets it drain.
			it = j.pickHead(now)
		}
		if it == nil {
			return
		}
		j.start(ctx, it, now)
	}
}

// runTaskBody is the /run-task request.
type runTaskBody struct {
	TaskID         string          `json:"task_id"`
	TaskType       string          `json:"task_type"`
	Label          string          `json:"label"`
	ParametersJSON json.RawMessage `json:"parameters_json,omitempty"`
	ReturnResult   bool            `json:"return_result"`
}

// taskID is deterministic, so a reissue (or a resumed job) attaches to the run the
// dispatcher has in flight or answered. After a failed answer, which the dispatcher
// keeps, the item moves to a fresh id to be run again.
func (j *job) taskID(it *item) string {
	if it.failures == 0 {
		return fmt.Sprintf("%s-%d", j.cp.JobID, it.line)
	}
	return fmt.Sprintf("%s-%d-r%d", j.cp.JobID, it.line, it.failures)
}

func (j *job) start(ctx context.Context, it *item, now time.Time) {
	body, err := json.Marshal(runTaskBody{TaskID: j.taskID(it), TaskType: it.task.taskType, Label: it.task.label, ParametersJSON: it.task.params, ReturnResult: true})
	if err != nil { // parameters came from a valid JSON line; cannot happen
		j.reject(it, "encoding the task: "+err.Error())
		return
	}
	actx, cancel := context.WithCancel(ctx)
	it.seq++
	it.inFlight, it.issuedAt, it.cancel = true, now, cancel
	j.inflight[it] = struct{}{}
	j.running++
	j.st.issued.Add(1)
	seq := it.seq
	go func() {
		status, b, ra, err := j.post(actx, body)
		j.results <- report{it: it, seq: seq, status: status, body: b, retryAfter: ra, err: err}
	}()
}

// post sends one /run-task and returns the answer and its Retry-After; err when there
// is none.
func (j *job) post(ctx context.Context, body []byte) (int, []byte, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, j.runTask, bytes.NewReader(body))
	if err != nil {
		return 0, nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if j.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+j.cfg.APIKey)
	}
	resp, err := j.cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, j.cfg.maxAnswerBytes+1))
	if err != nil {
		return 0, nil, 0, err
	}
	if int64(len(b)) > j.cfg.maxAnswerBytes {
		if resp.StatusCode == http.StatusOK {
			return resp.StatusCode, nil, 0, errAnswerTooLarge
		}
		b = b[:j.cfg.maxAnswerBytes] // an error's status says enough; its message is cut
	}
	return resp.StatusCode, b, retryAfter(resp.Header.Get("Retry-After"), time.Now()), nil
}

// errAnswerTooLarge: the dispatcher's 200 for one line is over the bound the job reads
// (a huge result). The line is rejected; the job goes on.
var errAnswerTooLarge = errors.New("answer larger than the job reads")

// retryAfter reads a Retry-After header (seconds or an HTTP date), bounded to five
// minutes; zero when absent or unreadable.
func retryAfter(v string, now time.Time) time.Duration {
	var d time.Duration
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		d = time.Duration(min(s, 300)) * time.Second // bounded before the product overflows
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), 5*time.Minute)
}

// answer is the part of the dispatcher's /run-task answer the job keeps.
type answer struct {
	Status    string          `json:"status"`
	WorkerID  string          `json:"worker_id"`
	LabelMiss bool            `json:"label_miss"`
	Result    json.RawMessage `json:"result"`
	Error     string          `json:"error"`
}

// handle takes an attempt's report.
func (j *job) handle(r report) {
	j.running--
	it := r.it
	if r.seq != it.seq || !it.inFlight {
		return // an attempt already timed out, or cancelled by a stop
	}
	it.inFlight = false
	delete(j.inflight, it)
	it.cancel()
	proxyOnlySince := it.proxyOnlySince
	it.proxyOnlySince = time.Time{} // kept only by another bare 502, below
	if r.err != nil {
		if errors.Is(r.err, errAnswerTooLarge) {
			// Read in part it is no answer; read again it is as large: the line's result
			// cannot be had through the job.
			j.reject(it, fmt.Sprintf("the dispatcher's answer (%d) is over %d bytes, more than the job reads", r.status, j.cfg.maxAnswerBytes))
			return
		}
		if errors.Is(r.err, context.Canceled) {
			j.retry = append(j.retry, it) // the job is stopping; keeps the books straight
			return
		}
		why := "no answer from the dispatcher"
		if hint := unreachable(r.err); hint != "" {
			if !j.answered {
				// Sent again it fails the same way: paused and retried for ever, a wrong
				// --dispatcher hung the run without a word past one warning.
				cause := r.err
				var urlErr *url.Error
				if errors.As(r.err, &urlErr) {
					cause = urlErr.Err // its text repeats the URL
				}
				j.fatal = fmt.Errorf("POST %s: %w; %s", j.runTask, cause, hint)
				return
			}
			why += " (" + hint + ")"
		}
		// No answer: the dispatcher is down or restarting. That is not the item's
		// fault, so it is not counted; issuing pauses with backoff instead.
		j.pause(j.bo.NextBackOff(), why, r.err)
		j.retry = append(j.retry, it)
		return
	}
	j.answered = true
	// A body that is not JSON leaves a empty, and an error's status says enough; a field
	// of another type leaves that field empty, and aerr says so.
	var a answer
	aerr := json.Unmarshal(r.body, &a)
	msg := a.Error
	if msg == "" {
		msg = strings.ToValidUTF8(strings.TrimSpace(string(r.body[:min(len(r.body), 200)])), "\uFFFD")
	}
	switch {
	case r.status == http.StatusOK && (a.Status != "completed" || aerr != nil):
		// The dispatcher's 200 is always a completed task, every field of its type.
		// Anything else (a gateway's sign-in page reached through a redirect; a
		// "label_miss" or "worker_id" of another type, which would be written as
		// false or empty) would be written as a result it is not, for every line:
		// stop instead.
		why := ""
		if aerr != nil && a.Status == "completed" {
			why = fmt.Sprintf(" (%v)", aerr)
		}
		j.fatal = fmt.Errorf("POST %s answered 200 with %q, not a task's answer%s; is --dispatcher the dispatcher's base URL, with nothing redirecting it (a sign-in page)?", j.runTask, msg, why)
	case r.status == http.StatusOK:
		j.bo.Reset()
		j.complete(it, a)
	case r.status == http.StatusBadRequest || r.status == http.StatusRequestEntityTooLarge:
		j.reject(it, fmt.Sprintf("dispatcher refused the task (%d): %s", r.status, msg))
	case r.status == http.StatusUnauthorized || r.status == http.StatusForbidden:
		j.fatal = fmt.Errorf("dispatcher refused the job's credentials (%d): %s; set --api-key", r.status, msg)
	case r.status == http.StatusNotFound || r.status == http.StatusMethodNotAllowed:
		// The dispatcher's /run-task has no 404 (that is GET /tasks/{id}'s unknown task):
		// the URL is not its API, and no line can run. Stop rather than reject them all.
		j.fatal = fmt.Errorf("POST %s answered %d: %s; is --dispatcher the dispatcher's base URL?", j.runTask, r.status, msg)
	case r.status == http.StatusConflict:
		// The dispatcher holds another task (label, type or parameters) under the id:
		// the job sent this line before and the input changed since, past what a resume
		// checks. That task's answer is not this line's and the id will not run it, so
		// the line moves to a fresh id at once (nothing failed; no wait). An attempt all
		// the same, so a 409 to every id cannot loop.
		if !j.warnedConflict {
			j.warnedConflict = true
			j.log.Warn().Int64("line", it.line).Str("task_id", j.taskID(it)).Str("error", msg).
				Msg("the dispatcher holds another task under a line's id: the input changed since the job sent it; such lines run under fresh ids")
		}
		it.failures++
		j.failAttempt(it, fmt.Sprintf("dispatcher answered %d: %s", r.status, msg))
	case r.status == http.StatusTooManyRequests || (r.status == http.StatusServiceUnavailable && a.Status != "failed"),
		r.status == http.StatusBadGateway && a.Status != "failed":
		// Refused before it ran (queue full, shutting down, or a proxy in front while the
		// dispatcher restarts), or a journaled task let go unfinished at shutdown (its
		// view, still queued or running), which runs after the restart: a 503 that is not
		// a failed answer keeps none for the id, and it is not the item's fault. A 502
		// that is not is a proxy's that could not reach the dispatcher (nginx's and
		// Traefik's answer to a refused or dropped connection): no answer, as without the
		// proxy, and counted as attempts it rejected every line a restart reached. Pause
		// as for no answer, no attempt, and keep the id to attach to a journaled run.
		j.pause(max(j.bo.NextBackOff(), r.retryAfter), fmt.Sprintf("dispatcher refused the task for now (%d)", r.status), errors.New(msg))
		if r.status == http.StatusBadGateway {
			// Unanswered for good, though, if the proxy passes other lines and never this
			// one (it takes the dispatcher's connection down: a query of death): paused
			// for ever, it held the window until the run stalled. A line that gets nothing
			// but such 502s for the work timeout is unanswered that long, and counts an
			// attempt as a timeout does; a restart is far shorter.
			if proxyOnlySince.IsZero() {
				proxyOnlySince = it.issuedAt
			}
			it.proxyOnlySince = proxyOnlySince
			if timeout := time.Duration(j.timeout.Load()); time.Since(proxyOnlySince) >= timeout {
				it.proxyOnlySince = time.Time{}
				j.failAttempt(it, fmt.Sprintf("a proxy answered only %d (it could not reach the dispatcher) for the work timeout %s: %s", r.status, timeout, msg))
				return
			}
		}
		j.retry = append(j.retry, it)
	default:
		// Only the task's failed answer (its view, status "failed") is kept by the
		// dispatcher under the id, so only that moves the item to a fresh id. That
		// includes the 504 for a worker that overran the deadline by 5 s without
		// reporting ("deadline exceeded: worker ... overran it ..."): the dispatcher fails
		// the task and cancels the attempt, so the fresh id runs it again and nothing is
		// lost. Any other 5xx keeps nothing under the id, or says the run goes on: a
		// proxy's 504 while the dispatcher holds the task, or the bare 504
		// "deadline exceeded; task ... is still running" of dispatchers from before they
		// failed overrun tasks (still handled for them, by this rule: no code of its
		// own). A fresh id would run it a second time and lose the first run's result;
		// the same id attaches to that run, or gets its kept answer.
		if a.Status == "failed" {
			it.failures++
		}
		// Issued again at once, it would likely fail the same way (a label in the
		// dispatcher's cool-down fails every task within milliseconds, and says for how
		// long in Retry-After; a backend that hung past one deadline may hang past the
		// next; an older dispatcher answered an overrun run's attach with its 504 at
		// once until the run ended), spending the item's attempts.
		it.setbacks++
		it.notBefore = time.Now().Add(max(min(j.cfg.RetryDelay<<min(it.setbacks-1, 10), 5*time.Minute), r.retryAfter))
		j.failAttempt(it, fmt.Sprintf("dispatcher answered %d: %s", r.status, msg))
	}
}

// unreachable says how to fix a request's failure that no retry can get past: a host
// that does not resolve, a server certificate the job does not trust, or an https URL
// of a server that answers in plain HTTP. Empty for the rest (refused, reset,
// timeouts, a DNS server that did not answer), which a dispatcher restarting gives too.
func unreachable(err error) string {
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return "its host name does not resolve: check --dispatcher"
	}
	var verifyErr *tls.CertificateVerificationError
	var authorityErr x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalidErr x509.CertificateInvalidError
	if errors.As(err, &verifyErr) || errors.As(err, &authorityErr) || errors.As(err, &hostErr) || errors.As(err, &invalidErr) {
		return "the job does not trust the dispatcher's certificate: check --dispatcher's host name, and give a private CA in SSL_CERT_FILE"
	}
	// The TLS client's first read found no TLS record: net/http says so when it looks
	// like HTTP (ErrSchemeMismatch), else passes the record error on.
	var recordErr tls.RecordHeaderError
	if errors.Is(err, http.ErrSchemeMismatch) || errors.As(err, &recordErr) {
		return "the server does not speak TLS: check --dispatcher's scheme (http:// for a dispatcher without --tls-cert)"
	}
	return ""
}

func (j *job) pause(d time.Duration, why string, err error) {
	if !j.pausing {
		j.log.Warn().Err(err).Dur("pause", d).Msg(why + "; pausing submissions")
	}
	// A pause only grows: a later, shorter backoff must not cut a Retry-After short.
	if till := time.Now().Add(d); !j.pausing || till.After(j.pauseTill) {
		j.pauseTill = till
	}
	j.pausing = true
}

// expire ends the attempts whose work timeout has passed (at the current timeout, so
// a change applies to items already issued).
func (j *job) expire(now time.Time) {
	timeout := time.Duration(j.timeout.Load())
	for it := range j.inflight {
		if now.Sub(it.issuedAt) < timeout {
			continue
		}
		it.seq++ // its report, when it comes, is stale
		it.inFlight = false
		delete(j.inflight, it)
		it.cancel()
		it.proxyOnlySince = time.Time{} // this timeout counts the attempt those 502s began
		j.failAttempt(it, fmt.Sprintf("no answer within the work timeout %s", timeout))
	}
}

// failAttempt counts a timed-out or failed attempt: the item is issued again, or
// rejected once it has had MaxAttempts.
func (j *job) failAttempt(it *item, why string) {
	it.attempts++
	it.lastErr = why
	if it.attempts >= j.cfg.MaxAttempts {
		j.reject(it, fmt.Sprintf("gave up after %d attempts; last: %s", it.attempts, why))
		return
	}
	j.st.reissued.Add(1)
	j.retry = append(j.retry, it)
}

// outputLine is a line of the output file.
type outputLine struct {
	Line      int64           `json:"line"`
	ID        json.RawMessage `json:"id,omitempty"`
	Status    string          `json:"status"` // completed | rejected
	Label     string          `json:"label,omitempty"`
	WorkerID  string          `json:"worker_id,omitempty"`
	LabelMiss bool            `json:"label_miss,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     string          `json:"error,omitempty"`
}

// rejectedLine is a line of the rejected file.
type rejectedLine struct {
	Line   int64           `json:"line"`
	ID     json.RawMessage `json:"id,omitempty"`
	Reason string          `json:"reason"`
	Input  string          `json:"input,omitempty"`
}

func (j *job) complete(it *item, a answer) {
	b, err := json.Marshal(outputLine{Line: it.line, ID: it.task.id, Status: "completed", Label: it.task.label, WorkerID: a.WorkerID, LabelMiss: a.LabelMiss, Result: validOrNil(a.Result)})
	if err != nil {
		j.reject(it, "encoding the result: "+err.Error())
		return
	}
	it.done, it.miss, it.out = true, a.LabelMiss, append(b, '\n')
	it.raw, it.task.params = nil, nil
	j.account(it)
}

// account brings held up to date with what it holds now.
func (j *job) account(it *item) {
	n := it.size()
	j.held += n - it.held
	it.held = n
	j.peakHeld = max(j.peakHeld, j.held)
}

func validOrNil(b json.RawMessage) json.RawMessage {
	if len(b) == 0 || !json.Valid(b) {
		return nil
	}
	return b
}

// reject writes a placeholder for the line in the output, so line n stays the answer
// for input line n, and the line with the reason in the rejected file.
func (j *job) reject(it *item, reason string) {
	out, _ := json.Marshal(outputLine{Line: it.line, ID: it.task.id, Status: "rejected", Error: reason})
	rej, _ := json.Marshal(rejectedLine{Line: it.line, ID: it.task.id, Reason: reason, Input: string(it.raw)})
	it.done, it.out, it.rej = true, append(out, '\n'), append(rej, '\n')
	it.raw, it.task.params = nil, nil
	j.account(it)
}

// flush writes the finished lines at the head of the window, in order. Lines are
// counted (completed, rejected, label misses) as they are written, not as their answers
// come: a job stopped with answers held behind an earlier line does not write them,
// and its resume runs and counts those lines again.
func (j *job) flush() error {
	n := 0
	for n < len(j.win) && j.win[n].done {
		it := j.win[n]
		if _, err := j.outW.Write(it.out); err != nil {
			return fmt.Errorf("writing output: %w", err)
		}
		j.written.OutputSize += int64(len(it.out))
		if it.rej != nil {
			if _, err := j.rejW.Write(it.rej); err != nil {
				return fmt.Errorf("writing rejected: %w", err)
			}
			j.written.RejectedSize += int64(len(it.rej))
			j.st.rejected.Add(1)
		} else {
			j.st.completed.Add(1)
			if it.miss {
				j.st.misses.Add(1)
			}
		}
		j.written.Lines = it.line
		j.written.InputOffset = it.end
		j.held -= it.held
		// Let go of its bytes here: the pool's fifo and label queues, cut at the front,
		// keep written items in their old slots until they next grow.
		it.out, it.rej = nil, nil
		j.win[n] = nil
		n++
	}
	if n == 0 {
		return nil
	}
	j.win = j.win[n:]
	j.st.lines.Add(int64(n))
	j.st.nextLine.Store(j.written.Lines + 1)
	if j.bar != nil {
		_ = j.bar.Add(n)
	}
	return nil
}

// checkpoint makes the written lines durable, then records them: output and rejected
// flushed and fsynced first, so the checkpoint never counts bytes a crash could lose.
func (j *job) checkpoint() error {
	if j.syncErr != nil {
		return j.syncErr
	}
	if j.written == j.cp {
		return nil
	}
	for _, w := range []struct {
		b *bufio.Writer
		f *os.File
	}{{j.outW, j.out}, {j.rejW, j.rej}} {
		if err := w.b.Flush(); err != nil {
			return fmt.Errorf("writing %s: %w", w.f.Name(), err)
		}
		if err := j.cfg.syncFile(w.f); err != nil {
			// Sticky: after a failed fsync the kernel may have dropped the dirty pages
			// and a second fsync succeeds, so no later checkpoint may count them.
			j.syncErr = fmt.Errorf("syncing %s: %w", w.f.Name(), err)
			return j.syncErr
		}
	}
	if err := j.written.save(j.cfg.Checkpoint, j.cfg.syncDir); err != nil {
		return err
	}
	j.cp = j.written
	return nil
}

// countLines counts the lines from offset to the end of path, for the progress bar.
func countLines(path string, offset int64) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return 0, err
	}
	var n int64
	buf := make([]byte, 256<<10)
	last := byte('\n')
	for {
		k, err := f.Read(buf)
		if k > 0 {
			n += int64(bytes.Count(buf[:k], []byte{'\n'}))
			last = buf[k-1]
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if last != '\n' {
		n++
	}
	return n, nil
}

func newBar(w io.Writer, total int64) *progressbar.ProgressBar {
	return progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("batch"),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("items"),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionSetWidth(30),
	)
}
