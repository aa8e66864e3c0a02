//go:build race

package scheduler

// raceDetector: the race detector slows the randomized tests about eightfold, so they
// run fewer seeds under it (the scheduler is single-threaded: it finds nothing there).
const raceDetector = true
