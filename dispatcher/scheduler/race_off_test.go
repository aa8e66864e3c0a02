//go:build !race

package scheduler

const raceDetector = false
