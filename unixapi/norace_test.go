//go:build !race

package unixapi_test

const raceEnabled = false
