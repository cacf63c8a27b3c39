//go:build !brokencache

package integration

// brokenBuild is true only when the suite itself runs with the deliberately
// broken cache.
const brokenBuild = false
