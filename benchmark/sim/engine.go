package sim

import (
	"bufio"
	"container/heap"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
)

// Router is what the simulator drives: the dispatcher's scheduler satisfies it, and so
// do the peer designs it is compared with.
type Router interface {
	AddWorker(scheduler.WorkerSpec) (*scheduler.Outcome, error)
	Submit(*scheduler.Task) (*scheduler.Outcome, error)
	Complete(workerID string, t *scheduler.Task, obs scheduler.Observation) (*scheduler.Outcome, error)
	Rebalance() *scheduler.Outcome
}

var _ Router = (*scheduler.Scheduler)(nil)

// Policies are the routing designs the simulator knows, by name.
var Policies = []string{"random", "seed-greedy", "ray-like", "ours"}

// Options tune the simulated policies.
type Options struct {
	// MaxPassOver is ours' starvation bound (scheduler.Config.MaxPassOver); zero means
	// the scheduler's default.
	MaxPassOver time.Duration
	// PassOverLoads is ours' pass-over bound in loads of the task's label
	// (scheduler.Config.PassOverLoads); zero means the scheduler's default.
	PassOverLoads float64
}

// NewRouter builds a policy on a clock. Ours starts from the dispatcher's estimates:
// its defaults, or the priors the scenario sets as an operator would with the
// dispatcher's flags. It is not told the scenario's distributions, which neither the
// dispatcher nor the peer designs know.
func NewRouter(policy string, clock scheduler.Clock, seed uint64, sc Scenario, opt Options) (Router, error) {
	switch policy {
	case "ours":
		return scheduler.New(scheduler.Config{Policy: scheduler.PolicyAffinity, Seed: seed,
			LoadTimePrior: sc.Scheduler.LoadTimePrior.D(), RunTimePrior: sc.Scheduler.RunTimePrior.D(),
			MaxPassOver: opt.MaxPassOver, PassOverLoads: opt.PassOverLoads}, clock)
	case "random":
		return scheduler.New(scheduler.Config{Policy: scheduler.PolicyRandom, Seed: seed}, clock)
	case "seed-greedy":
		return newSeedGreedy(seed), nil
	case "ray-like":
		return newRayLike(seed), nil
	}
	return nil, fmt.Errorf("policy %q unknown (want one of %s)", policy, strings.Join(Policies, ", "))
}

// tickEvery mirrors the dispatcher, which calls Rebalance with its deadline check.
const tickEvery = 20 * time.Millisecond

type eventKind uint8

const (
	evArrive eventKind = iota
	evFinish
	evTick
)

type event struct {
	at       time.Duration
	seq      uint64
	kind     eventKind
	task     *simTask
	producer int
	worker   string
	load     bool
	// labelWait is how long the finishing task waited for its label on the worker:
	// its own load, or the rest of a load another task started there.
	labelWait time.Duration
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type simTask struct {
	sched    scheduler.Task
	arrived  time.Duration
	producer int
	load     time.Duration // drawn per task, so every policy sees the same durations
	run      time.Duration
}

type vclock struct {
	base time.Time
	now  time.Duration
}

func (c *vclock) Now() time.Time { return c.base.Add(c.now) }

// engine runs one policy over one scenario.
type engine struct {
	sc     Scenario
	router Router
	clock  *vclock
	events eventQueue
	seq    uint64

	pop        popularity
	labelNames []string
	loadDist   []Dist
	runDist    []Dist
	taskRNG    *rand.Rand   // labels and durations of open-loop tasks
	prodRNG    []*rand.Rand // per producer: labels, durations, pauses
	// outstanding is, per closed-loop producer, how many tasks of its latest burst (one
	// task without bursts) have not finished: it pauses once none has.
	outstanding []int
	trace       []traceLine

	submitted, finished int
	waiting             int // submitted, not started
	tickPending         bool
	// running counts the slots in use. While every slot of the dispatcher's scheduler
	// is, a Rebalance can start nothing, so the tick sleeps (sleepingTick holds when it
	// was due) until a task finishes, and then resumes on the same 20 ms grid. Ticking
	// through a task that runs for hours took minutes of real time.
	running      int
	sleepingTick time.Duration
	sleeping     bool
	rebalances   int

	res       Result
	latencies []float64
	distinct  map[string]struct{}
	busy      time.Duration
	// loadEnds is when each worker's latest load of a label ends: a task sent to a
	// worker with other free slots while its copy still loads waits for that load, as
	// on a real worker.
	loadEnds map[copyKey]time.Duration
}

type copyKey struct{ worker, label string }

type traceLine struct {
	at    time.Duration
	label string
}

// Run simulates the scenario under one policy. The same seed gives the same tasks
// (labels, arrival times, load and run durations) to every policy.
func Run(sc Scenario, policy string, seed uint64, opt Options) (Result, error) {
	e, err := simulate(sc, policy, seed, opt)
	if err != nil {
		return Result{}, err
	}
	return e.result(), nil
}

// simulate is Run, returning the engine for the tests to look into.
func simulate(sc Scenario, policy string, seed uint64, opt Options) (*engine, error) {
	clock := newClock()
	router, err := NewRouter(policy, clock, seed, sc, opt)
	if err != nil {
		return nil, err
	}
	return simulateOn(sc, policy, seed, router, clock)
}

func newClock() *vclock { return &vclock{base: time.Unix(1_700_000_000, 0)} }

// simulateOn is simulate on a router built on clock: the tests wrap one to watch
// what the engine submits.
func simulateOn(sc Scenario, policy string, seed uint64, router Router, clock *vclock) (*engine, error) {
	e := &engine{sc: sc, router: router, clock: clock, pop: newPopularity(sc.Labels),
		taskRNG: rand.New(rand.NewPCG(seed, 1)), distinct: map[string]struct{}{}, loadEnds: map[copyKey]time.Duration{}}
	e.res.Policy = policy
	e.res.sent = map[int]int{}
	e.labelNames = make([]string, sc.Labels.Count)
	e.loadDist = make([]Dist, sc.Labels.Count)
	e.runDist = make([]Dist, sc.Labels.Count)
	for i := range e.labelNames {
		name := fmt.Sprintf("label-%d", i+1)
		e.labelNames[i] = name
		e.loadDist[i], e.runDist[i] = sc.Load, sc.Run
		if d, ok := sc.Labels.Load[name]; ok {
			e.loadDist[i] = d
		}
		if d, ok := sc.Labels.Run[name]; ok {
			e.runDist[i] = d
		}
	}
	for i := 0; i < sc.Workers.Count; i++ {
		out, err := router.AddWorker(scheduler.WorkerSpec{ID: fmt.Sprintf("w%d", i+1), MaxLabels: sc.Workers.MaxLabels, Slots: sc.Workers.Slots})
		if err != nil {
			return nil, err
		}
		e.apply(out)
	}
	if err := e.seedArrivals(seed); err != nil {
		return nil, err
	}
	for len(e.events) > 0 {
		ev := heap.Pop(&e.events).(event)
		e.clock.now = ev.at
		switch ev.kind {
		case evArrive:
			e.arrive(ev)
		case evFinish:
			e.finish(ev)
		case evTick:
			if e.waiting > 0 && e.canSleep() { // with none waiting the ticks stop anyway
				e.sleeping, e.sleepingTick = true, ev.at
				continue // still pending: wake resumes it
			}
			e.tickPending = false
			e.rebalances++
			e.apply(e.router.Rebalance())
		}
		if e.waiting > 0 && !e.tickPending {
			e.tickPending = true
			e.push(event{at: e.clock.now + tickEvery, kind: evTick})
		}
	}
	if e.waiting > 0 {
		return nil, fmt.Errorf("policy %s left %d tasks waiting with no event to start them", policy, e.waiting)
	}
	return e, nil
}

// canSleep is whether a tick now can change nothing: the router is the dispatcher's
// scheduler (the peer designs queue at busy workers, so their ticks matter) and every
// slot of the fleet is running a task.
func (e *engine) canSleep() bool {
	_, ours := e.router.(*scheduler.Scheduler)
	return ours && e.running >= e.sc.Workers.Count*e.sc.Workers.Slots
}

// wake puts a sleeping tick back on its grid, at its first time after now: the tick
// that would have come at this instant ran before the event that woke it, and could
// start nothing.
func (e *engine) wake() {
	if !e.sleeping {
		return
	}
	e.sleeping = false
	at := e.sleepingTick
	if at <= e.clock.now {
		at += (e.clock.now-at)/tickEvery*tickEvery + tickEvery
	}
	e.push(event{at: at, kind: evTick})
}

func (e *engine) push(ev event) {
	e.seq++
	ev.seq = e.seq
	heap.Push(&e.events, ev)
}

func (e *engine) seedArrivals(seed uint64) error {
	a := e.sc.Arrival
	switch a.Kind {
	case "closed":
		e.prodRNG = make([]*rand.Rand, a.Producers)
		e.outstanding = make([]int, a.Producers)
		for p := range e.prodRNG {
			e.prodRNG[p] = rand.New(rand.NewPCG(seed, uint64(100+p)))
			e.push(event{at: 0, kind: evArrive, producer: p})
		}
	case "poisson":
		e.push(event{at: 0, kind: evArrive, producer: -1})
	case "trace":
		lines, err := readTrace(a.File)
		if err != nil {
			return err
		}
		e.trace = lines
		for i := range lines {
			e.push(event{at: lines[i].at, kind: evArrive, producer: -2 - i})
		}
	}
	return nil
}

// quota is how many tasks producer p sends in a closed loop.
func (e *engine) quota(p int) int {
	n, k := e.sc.Tasks, e.sc.Arrival.Producers
	q := n / k
	if p < n%k {
		q++
	}
	return q
}

// arrive submits what one arrival brings: a trace line's task, or a burst of tasks
// for one label (one task unless the scenario gives bursts). Random numbers are drawn
// in this order: the burst's size (uniform bursts only), its label, then each task's
// load and run.
func (e *engine) arrive(ev event) {
	r := e.taskRNG
	if ev.producer >= 0 {
		r = e.prodRNG[ev.producer]
	}
	if ev.producer <= -2 {
		e.submit(ev.producer, e.trace[-2-ev.producer].label, e.sc.Load, e.sc.Run, r)
		return
	}
	n := 1
	if b := e.sc.Arrival.Burst; b.on() {
		n = min(b.size(r), e.tasksLeft(ev.producer))
	}
	if ev.producer >= 0 {
		e.outstanding[ev.producer] = n
	}
	li := e.pop.draw(r, e.clock.now)
	for range n {
		e.submit(ev.producer, e.labelNames[li], e.loadDist[li], e.runDist[li], r)
	}
	if ev.producer == -1 && e.submitted < e.sc.Tasks {
		e.push(event{at: e.clock.now + e.interarrival(), kind: evArrive, producer: -1})
	}
}

// tasksLeft is how many tasks the open loop (producer -1), or closed-loop producer p
// between bursts, has still to send.
func (e *engine) tasksLeft(p int) int {
	if p < 0 {
		return e.sc.Tasks - e.submitted
	}
	return e.quota(p) - e.res.sent[p]
}

// submit hands one task of the label to the router, its load and run drawn from r.
func (e *engine) submit(producer int, label string, load, run Dist, r *rand.Rand) {
	t := &simTask{arrived: e.clock.now, producer: producer}
	t.load, t.run = load.sample(r), run.sample(r)
	e.submitted++
	t.sched = scheduler.Task{ID: strconv.Itoa(e.submitted), Label: label, Ref: t}
	e.distinct[label] = struct{}{}
	e.waiting++
	out, err := e.router.Submit(&t.sched)
	if err != nil {
		panic(fmt.Sprintf("submit: %v", err)) // a fresh task: cannot happen
	}
	e.apply(out)
}

// interarrival draws the time to the next open-loop arrival. Rate and utilisation
// count tasks, so arrivals come that often divided by the mean burst.
func (e *engine) interarrival() time.Duration {
	rate := e.sc.Arrival.Rate
	if rate == 0 {
		capacity := float64(e.sc.Workers.Count*e.sc.Workers.Slots) / e.sc.Run.mean().Seconds()
		rate = e.sc.Arrival.Utilisation * capacity
	}
	rate /= e.sc.Arrival.Burst.mean() // exactly 1 without bursts
	return time.Duration(e.taskRNG.ExpFloat64() / rate * float64(time.Second))
}

func (e *engine) apply(out *scheduler.Outcome) {
	for _, a := range out.Assigned {
		t := a.Task.Ref.(*simTask)
		e.waiting--
		var wait time.Duration
		key := copyKey{a.WorkerID, a.Task.Label}
		if a.Load {
			wait = t.load
			e.res.Misses++
			e.loadEnds[key] = e.clock.now + t.load
		} else if end := e.loadEnds[key]; end > e.clock.now {
			wait = end - e.clock.now
		}
		dur := wait + t.run
		if a.EvictLabel != "" {
			e.res.Evictions++
		}
		e.res.queueWait += e.clock.now - t.arrived
		e.busy += dur
		e.running++
		e.push(event{at: e.clock.now + dur, kind: evFinish, task: t, worker: a.WorkerID, load: a.Load, labelWait: wait})
	}
	for range out.Failed {
		e.waiting--
		e.res.Failed++
	}
}

func (e *engine) finish(ev event) {
	t := ev.task
	// As the agent reports it, the load time is the wait for the label, a load another
	// attempt started included; with the run it makes up the whole attempt, so the
	// scheduler sees no delay outside the task (there is none here).
	obs := scheduler.Observation{Loaded: ev.load, LoadTime: ev.labelWait, RunTime: t.run}
	out, err := e.router.Complete(ev.worker, &t.sched, obs)
	if err != nil {
		panic(fmt.Sprintf("complete: %v", err))
	}
	e.finished++
	e.running--
	e.wake()
	lat := e.clock.now - t.arrived
	e.latencies = append(e.latencies, lat.Seconds())
	// As the agent reports it (its total_ms): from receiving the task to its result,
	// so a wait for a load another task started on the worker counts too.
	e.res.taskRuntime += ev.labelWait + t.run
	e.apply(out)
	if p := t.producer; p >= 0 {
		e.res.sent[p]++
		e.outstanding[p]--
		if e.outstanding[p] == 0 && e.res.sent[p] < e.quota(p) {
			a := e.sc.Arrival
			wait := time.Duration(e.prodRNG[p].NormFloat64()*float64(a.WaitStddev) + float64(a.WaitAvg))
			e.push(event{at: e.clock.now + max(wait, a.MinWait.D()), kind: evArrive, producer: p})
		}
	}
}

// maxTraceTime bounds a trace's arrival times. A year is longer than any trace is
// meant to replay, and leaves the virtual clock (a time.Duration, about 292 years)
// room for the loads, runs and ticks that follow the last arrival. Unchecked, a time
// past 2^63 ns (or inf, or NaN) converted to a Duration arrives at whatever the
// platform makes of it: MinInt64, 292 years before the start, on amd64.
const maxTraceTime = 365 * 24 * time.Hour

func readTrace(path string) ([]traceLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	return parseTrace(f, path)
}

// parseTrace reads "seconds,label" lines (blank lines and # comments skipped), and
// returns them ordered by time, lines of equal time in file order: the order the
// engine pushes arrivals in. name is the file's, for errors.
func parseTrace(r io.Reader, name string) ([]traceLine, error) {
	var out []traceLine
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ts, label, ok := strings.Cut(line, ",")
		label = strings.TrimSpace(label)
		if !ok || label == "" {
			return nil, fmt.Errorf("trace %s line %d: want \"seconds,label\", got %q", name, n, line)
		}
		secs, err := strconv.ParseFloat(strings.TrimSpace(ts), 64)
		// Written so that NaN fails it too.
		if err != nil || !(secs >= 0 && secs <= maxTraceTime.Seconds()) {
			return nil, fmt.Errorf("trace %s line %d: time %q is not a number of seconds from 0 to %d (a year)", name, n, strings.TrimSpace(ts), int64(maxTraceTime.Seconds()))
		}
		out = append(out, traceLine{at: time.Duration(secs * float64(time.Second)), label: label})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace %s line %d: %w", name, n+1, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("trace %s: no tasks", name)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out, nil
}
