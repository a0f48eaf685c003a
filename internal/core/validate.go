package core

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/arborhq/arbor/arbortype"
)

// checkJSON refuses a document that is malformed, over the payload limit, not
// UTF-8, or that jsonb cannot store (a \u0000 escape: jsonb's text cannot
// hold a NUL). An empty document means none. What only the database can
// judge (a number beyond numeric's range) it refuses in the statement,
// which rolls back, and mapDBError says ErrInvalidJSON.
func (e *Engine) checkJSON(field string, doc json.RawMessage) error {
	if len(doc) == 0 {
		return nil
	}
	if len(doc) > e.Cfg.MaxPayloadBytes {
		return fmt.Errorf("%s is %d bytes, over the limit of %d: %w", field, len(doc), e.Cfg.MaxPayloadBytes, arbortype.ErrPayloadTooLarge)
	}
	if !utf8.Valid(doc) {
		return fmt.Errorf("%s is not valid UTF-8: %w", field, arbortype.ErrInvalidJSON)
	}
	if !json.Valid(doc) {
		return fmt.Errorf("%s: %w", field, arbortype.ErrInvalidJSON)
	}
	if hasNULEscape(doc) {
		return fmt.Errorf("%s contains \\u0000, which PostgreSQL's jsonb cannot store: %w", field, arbortype.ErrInvalidJSON)
	}
	return nil
}

// hasNULEscape reports whether a valid JSON document has a \u0000 escape:
// a "u0000" after an odd run of backslashes ("\\u0000" is a backslash
// followed by the text u0000, which jsonb stores).
func hasNULEscape(doc []byte) bool {
	for i := 0; ; {
		j := bytes.Index(doc[i:], []byte("u0000"))
		if j < 0 {
			return false
		}
		at := i + j
		run := 0
		for k := at - 1; k >= 0 && doc[k] == '\\'; k-- {
			run++
		}
		if run%2 == 1 {
			return true
		}
		i = at + 1
	}
}

// checkText refuses a text that PostgreSQL cannot store or that is over
// limit; required refuses an empty one too.
func checkText(field, s string, required bool) error {
	switch {
	case required && s == "":
		return fmt.Errorf("%s is empty: %w", field, arbortype.ErrInvalidArgument)
	case len(s) > maxTextBytes:
		return fmt.Errorf("%s is %d bytes, over the limit of %d: %w", field, len(s), maxTextBytes, arbortype.ErrInvalidArgument)
	case !utf8.ValidString(s) || strings.ContainsRune(s, 0):
		return fmt.Errorf("%s is not valid UTF-8 text: %w", field, arbortype.ErrInvalidArgument)
	}
	return nil
}

// boundedError returns the error to record for a failure: the message
// truncated to the engine's limit (never refused: a failure must not be
// lost for its size), the detail checked like any other payload.
func (e *Engine) boundedError(taskErr TaskError) (*TaskError, error) {
	if err := e.checkJSON("error detail", taskErr.Detail); err != nil {
		return nil, err
	}
	msg := strings.ToValidUTF8(strings.ReplaceAll(taskErr.Message, "\x00", ""), "\uFFFD")
	if len(msg) > e.Cfg.MaxErrorMessageBytes {
		cut := e.Cfg.MaxErrorMessageBytes - len("…")
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	if err := checkText("error code", taskErr.Code, false); err != nil {
		return nil, err
	}
	return &TaskError{Code: taskErr.Code, Message: msg, Detail: taskErr.Detail, NonRetryable: taskErr.NonRetryable}, nil
}
