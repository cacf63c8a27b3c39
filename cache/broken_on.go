//go:build brokencache

package cache

// brokenKeepOnReset: a deliberately wrong cache (deletes lost on reset), for
// the integration suite's proof that its checker fails. Never in a release.
const brokenKeepOnReset = true
