package record

import (
	"unicode"
	"unicode/utf8"
)

// nameProblem says why s cannot be a name (a zone, a version, a metadata
// key, a gRPC service): it must be valid UTF-8 of printable characters with
// no space of any kind, so that it prints as one word in a table, a log
// line or a shell. It returns "" for a good name.
func nameProblem(s string) string {
	if !utf8.ValidString(s) {
		return "not valid UTF-8"
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || r == ' ' {
			return "has a control, space or unprintable character"
		}
	}
	return ""
}

// textProblem says why s cannot be free text (a metadata value, a drain
// reason): it must be valid UTF-8 with no control characters (C0, DEL, C1:
// no newline, tab or escape sequence that would forge a log line or move a
// terminal's cursor). Spaces are fine. It returns "" for good text.
func textProblem(s string) string {
	if !utf8.ValidString(s) {
		return "not valid UTF-8"
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return "has a control character"
		}
	}
	return ""
}
