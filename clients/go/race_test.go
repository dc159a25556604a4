//go:build race

package analytics

// raceEnabled shortens the long loops: the race detector slows every call
// about tenfold.
const raceEnabled = true
