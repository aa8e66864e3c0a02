package agent

// SetLabelHooks makes Run call onJoin when a task starts waiting for a load another
// task started, and onWait when a task starts waiting for room. Either may be nil.
func SetLabelHooks(cfg *Config, onJoin, onWait func(label string)) {
	cfg.hooks = &testHooks{labelJoin: onJoin, labelWait: onWait}
}
