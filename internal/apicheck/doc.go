// Package apicheck holds the module's checks of its own API, as tests that
// read every package's export data (go list -export, go/importer):
//
//   - no exported name of a package outside internal/ has a type that
//     names an internal package's type (a caller outside the module could
//     see it but never build or name it);
//   - a package's exported sentinel errors are declared in one file, as
//     one documented block.
//
// It has no code of its own.
package apicheck
