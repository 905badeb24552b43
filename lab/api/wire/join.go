package wire

import (
	"bytes"
	"io"

	"github.com/idempotency-lab/lab/lab"
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
	fields, err := readObject(data)
	if err != nil {
		return "", err
	}
	for _, f := range fields {
		if f.name != "code" {
			return "", lab.Invalid(fieldParam(f.name), "unknown field %s; allowed: code", clip(f.name))
		}
		if code, err = jsonString("code", f.value, true); err != nil {
			return "", err
		}
		if code == "" {
			return "", lab.Invalid("code", "is required: 1..%d bytes of printable text", lab.MaxKeyBytes)
		}
		if err := lab.CheckText("code", code, lab.MaxKeyBytes); err != nil {
			return "", err
		}
	}
	return code, nil
}
