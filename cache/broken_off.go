//go:build !brokencache

package cache

// brokenKeepOnReset is true only in the `brokencache` test build, which
// exists to prove that the integration suite's history checker catches a
// cache that keeps instances a reset snapshot no longer holds.
const brokenKeepOnReset = false
