package lab

import (
	"bytes"
	"io"
	"unicode/utf8"
)

// ParseJoinRequest reads the body of POST /lab/join as strictly as a
// charge's: nothing (no join code), or one JSON object {"code": "…"} and
// nothing after it, without duplicate keys or invalid UTF-8.
func ParseJoinRequest(body io.Reader) (code string, err error) {
	data, err := readBody(body)
	if err != nil {
		return "", err
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return "", nil
	}
	if !utf8.Valid(data) {
		return "", Invalid("body", "must be valid UTF-8 (invalid byte at offset %d)", invalidUTF8At(data))
	}
	fields, err := splitObject(data)
	if err != nil {
		return "", err
	}
	for _, f := range fields {
		if f.name != "code" {
			return "", Invalid(fieldParam(f.name), "unknown field %s; allowed: code", clip(f.name))
		}
		if code, err = jsonString("code", f.value, true); err != nil {
			return "", err
		}
		if err := checkText("code", code, MaxKeyBytes, true); err != nil {
			return "", err
		}
	}
	return code, nil
}
