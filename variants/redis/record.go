package redis

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// What a key's value holds: a claim while its first attempt works (or an
// unsettled claim once the ledger's answer was lost), then the completed
// record, the response to replay.

// record is the completed response cached under a key.
type record struct {
	Fingerprint string    `json:"fingerprint"`
	Status      int       `json:"status"`
	Body        []byte    `json:"body"`
	CreatedAt   time.Time `json:"created_at"`
}

// value renders a completed record as JSON.
func (r record) value() string {
	b, _ := json.Marshal(r) // cannot fail: strings, an int, bytes and a time in the lab's years
	return string(b)
}

// A claim's value names its owner, the request it is for, when it was taken
// and the charge it may apply. An unsettled value keeps that charge id when
// the ledger's answer was lost, so the next claimant retries the same charge.
const (
	claimPrefix     = "claim|"
	unsettledPrefix = "unsettled|"
)

func claimValue(token, fingerprint string, now time.Time, chargeID string) string {
	return claimPrefix + token + "|" + fingerprint + "|" + strconv.FormatInt(now.UnixMilli(), 10) + "|" + chargeID
}

// unsettledValue is a claim kept with its charge id, owned by nobody.
func unsettledValue(claim string) string {
	return unsettledPrefix + strings.TrimPrefix(claim, claimPrefix)
}

// decoded is what a key currently holds.
type decoded struct {
	state       string // lab.KeyInFlight or lab.KeyCompleted
	fingerprint string
	chargeID    string
	unsettled   bool // in flight with no owner: its charge's outcome is unknown
	rec         record
}

func decode(v string) (decoded, error) {
	rest, claimed := strings.CutPrefix(v, claimPrefix)
	if !claimed {
		rest, claimed = strings.CutPrefix(v, unsettledPrefix)
	}
	if claimed {
		parts := strings.SplitN(rest, "|", 4) // token, fingerprint, claimed at (unix ms), charge id
		d := decoded{state: lab.KeyInFlight, unsettled: strings.HasPrefix(v, unsettledPrefix)}
		if len(parts) == 4 {
			ms, _ := strconv.ParseInt(parts[2], 10, 64)
			d.fingerprint, d.rec.CreatedAt, d.chargeID = parts[1], time.UnixMilli(ms).UTC(), parts[3]
		}
		return d, nil
	}
	var r record
	var err error
	if rest, ok := strings.CutPrefix(v, donePrefix); ok {
		r, err = parsePacked(rest)
	} else {
		err = json.Unmarshal([]byte(v), &r)
	}
	if err != nil {
		return decoded{}, fmt.Errorf("error decoding record: %w", err)
	}
	return decoded{state: lab.KeyCompleted, fingerprint: r.Fingerprint, rec: r}, nil
}

// Earlier versions packed a record as "done|<fingerprint>|<status>|<created
// unix ms>|<body>", which saved a replay about 5 µs of JSON decoding: too
// little to show in lab bench, so records are JSON again. Packed ones still
// within their retention are read.
const donePrefix = "done|"

func parsePacked(v string) (record, error) {
	parts := strings.SplitN(v, "|", 4) // fingerprint, status, created at, body (which may hold '|')
	if len(parts) != 4 {
		return record{}, fmt.Errorf("error decoding record: %d fields", len(parts))
	}
	status, err := strconv.Atoi(parts[1])
	if err != nil {
		return record{}, fmt.Errorf("error decoding record status: %w", err)
	}
	ms, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return record{}, fmt.Errorf("error decoding record time: %w", err)
	}
	return record{Fingerprint: parts[0], Status: status, CreatedAt: time.UnixMilli(ms).UTC(), Body: []byte(parts[3])}, nil
}
