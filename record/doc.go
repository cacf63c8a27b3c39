// Package record defines what a registry record is: where an instance lives
// in etcd (the key layout of docs/architecture.md), which instances are valid, and how
// a record is encoded and decoded. It does no I/O.
//
// Every rule here is a contract: a record that Validate accepts is one every
// reader can decode, and a value under the prefix that Decode refuses is junk
// that readers skip and count instead of crashing on.
package record
