//go:build race

package main

// raceEnabled builds the regctl binary under test with -race when the
// tests themselves run with -race.
const raceEnabled = true
