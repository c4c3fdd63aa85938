//go:build !race

package leader

const raceEnabled = false
