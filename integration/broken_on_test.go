//go:build brokencache

package integration

const brokenBuild = true
