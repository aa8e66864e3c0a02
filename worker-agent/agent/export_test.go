package agent

// SetLabelHooks makes Run call onJoin when a task starts waiting for a load another
// task started, and onWait when a task starts waiting for room. Either may be nil.
func SetLabelHooks(cfg *Config, onJoin, onWait func(label string)) {
	h := hooksOf(cfg)
	h.labelJoin, h.labelWait = onJoin, onWait
}

// DeadlineClock and DeadlineTimer are what SetDeadlineClock takes.
type (
	DeadlineClock = deadlineClock
	DeadlineTimer = deadlineTimer
)

// SetDeadlineClock makes Run measure task deadlines against c and arm their timer
// with c, instead of the wall clock.
func SetDeadlineClock(cfg *Config, c DeadlineClock) { hooksOf(cfg).clock = c }

func hooksOf(cfg *Config) *testHooks {
	if cfg.hooks == nil {
		cfg.hooks = &testHooks{}
	}
	return cfg.hooks
}
