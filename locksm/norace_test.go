//go:build !race

package locksm

const raceEnabled = false
