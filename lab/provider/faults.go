package provider

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// FaultHeader carries per-request faults, e.g. "error_rate=0.3,latency_ms=50".
const FaultHeader = "Provider-Fault"

// Faults is what the provider does wrong to a namespace's requests, as the
// standing faults of PUT /faults/{ns} and, in header form, per request.
type Faults struct {
	// Down: the provider answers nothing; the connection is closed and
	// nothing is recorded.
	Down bool `json:"down"`
	// ErrorRate is the probability of a 503 with nothing recorded.
	ErrorRate float64 `json:"error_rate"`
	// LatencyMS delays the handling of each request (0..10000).
	LatencyMS int `json:"latency_ms"`
	// AppliedResponseLost is the probability that a request is applied and
	// its answer withheld: the client times out on a capture that happened.
	AppliedResponseLost float64 `json:"applied_response_lost"`
	// Decline records captures as failed.
	Decline bool `json:"decline"`
	// WebhookDuplicate sends a capture's final webhook twice.
	WebhookDuplicate bool `json:"webhook_duplicate"`
	// WebhookReorder sends a capture's final webhook before its
	// capture.processing one.
	WebhookReorder bool `json:"webhook_reorder"`
	// WebhookBadSignature also sends a copy of the final webhook signed
	// with a wrong secret, which the receiver must refuse.
	WebhookBadSignature bool `json:"webhook_bad_signature"`
	// WebhookDelayMS holds a capture's webhooks back this long
	// (0..MaxWebhookDelayMS): the charge stays pending meanwhile, and a
	// lab that stops in between hears them after it restarts.
	WebhookDelayMS int `json:"webhook_delay_ms"`
}

// MaxLatencyMS bounds the latency fault.
const MaxLatencyMS = 10_000

// MaxWebhookDelayMS bounds the webhook_delay_ms fault: 10 minutes, past the
// bound after which reconcile calls a pending charge stuck.
const MaxWebhookDelayMS = 600_000

// Validate accepts faults whose values are in range.
func (f Faults) Validate() error {
	switch {
	case !probability(f.ErrorRate):
		return fmt.Errorf("error_rate must be in 0..1 (got %v)", f.ErrorRate)
	case f.LatencyMS < 0 || f.LatencyMS > MaxLatencyMS:
		return fmt.Errorf("latency_ms must be in 0..%d (got %d)", MaxLatencyMS, f.LatencyMS)
	case !probability(f.AppliedResponseLost):
		return fmt.Errorf("applied_response_lost must be in 0..1 (got %v)", f.AppliedResponseLost)
	case f.WebhookDelayMS < 0 || f.WebhookDelayMS > MaxWebhookDelayMS:
		return fmt.Errorf("webhook_delay_ms must be in 0..%d (got %d)", MaxWebhookDelayMS, f.WebhookDelayMS)
	}
	return nil
}

func probability(p float64) bool { return !math.IsNaN(p) && p >= 0 && p <= 1 }

// String renders f in header form; ParseFaults reads it back as f.
func (f Faults) String() string {
	var items []string
	flag := func(on bool, name string) {
		if on {
			items = append(items, name)
		}
	}
	rate := func(p float64, name string) {
		if p != 0 {
			items = append(items, name+"="+strconv.FormatFloat(p, 'g', -1, 64))
		}
	}
	flag(f.Down, "down")
	flag(f.Decline, "decline")
	rate(f.ErrorRate, "error_rate")
	if f.LatencyMS != 0 {
		items = append(items, "latency_ms="+strconv.Itoa(f.LatencyMS))
	}
	rate(f.AppliedResponseLost, "applied_response_lost")
	flag(f.WebhookDuplicate, "webhook_duplicate")
	flag(f.WebhookReorder, "webhook_reorder")
	flag(f.WebhookBadSignature, "webhook_bad_signature")
	if f.WebhookDelayMS != 0 {
		items = append(items, "webhook_delay_ms="+strconv.Itoa(f.WebhookDelayMS))
	}
	return strings.Join(items, ",")
}

// ParseFaults reads a Provider-Fault header.
func ParseFaults(header string) (Faults, error) {
	o, err := parseOverride(header)
	return o.faults, err
}

// override is a parsed Provider-Fault header: the faults it names, and
// which items it gave, since an item given as 0 still replaces the
// namespace's standing value.
type override struct {
	faults Faults
	given  map[string]bool
}

// Fault items of the Provider-Fault header.
var faultItems = []string{"down", "decline", "error_rate", "latency_ms", "applied_response_lost",
	"webhook_duplicate", "webhook_reorder", "webhook_bad_signature", "webhook_delay_ms"}

func parseOverride(header string) (override, error) {
	o := override{given: map[string]bool{}}
	f := &o.faults
	for item := range strings.SplitSeq(header, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, value, hasValue := strings.Cut(item, "=")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if o.given[name] {
			return o, fmt.Errorf("%s gives %q twice", FaultHeader, name)
		}
		o.given[name] = true
		var flag *bool
		switch name {
		case "down":
			flag = &f.Down
		case "decline":
			flag = &f.Decline
		case "webhook_duplicate":
			flag = &f.WebhookDuplicate
		case "webhook_reorder":
			flag = &f.WebhookReorder
		case "webhook_bad_signature":
			flag = &f.WebhookBadSignature
		case "error_rate":
			p, err := parseProbability(name, value, hasValue)
			if err != nil {
				return o, err
			}
			f.ErrorRate = p
		case "applied_response_lost":
			f.AppliedResponseLost = 1 // alone, the answer is always lost
			if hasValue {
				p, err := parseProbability(name, value, true)
				if err != nil {
					return o, err
				}
				f.AppliedResponseLost = p
			}
		case "latency_ms":
			ms, err := strconv.Atoi(value)
			if !hasValue || err != nil || ms < 0 || ms > MaxLatencyMS {
				return o, fmt.Errorf("%s: latency_ms must be an integer in 0..%d (got %q)", FaultHeader, MaxLatencyMS, value)
			}
			f.LatencyMS = ms
		case "webhook_delay_ms":
			ms, err := strconv.Atoi(value)
			if !hasValue || err != nil || ms < 0 || ms > MaxWebhookDelayMS {
				return o, fmt.Errorf("%s: webhook_delay_ms must be an integer in 0..%d (got %q)", FaultHeader, MaxWebhookDelayMS, value)
			}
			f.WebhookDelayMS = ms
		default:
			return o, fmt.Errorf("%s: unknown item %q; allowed: %s", FaultHeader, name, strings.Join(faultItems, ", "))
		}
		if flag != nil {
			if hasValue {
				return o, fmt.Errorf("%s: %s takes no value (got %q)", FaultHeader, name, item)
			}
			*flag = true
		}
	}
	return o, nil
}

func parseProbability(name, value string, hasValue bool) (float64, error) {
	p, err := strconv.ParseFloat(value, 64)
	if !hasValue || err != nil || !probability(p) {
		return 0, fmt.Errorf("%s: %s must be a number in 0..1 (got %q)", FaultHeader, name, value)
	}
	return p, nil
}

// over returns standing with the header's items in their place.
func (o override) over(standing Faults) Faults {
	f := standing
	h := o.faults
	for name := range o.given {
		switch name {
		case "down":
			f.Down = h.Down
		case "decline":
			f.Decline = h.Decline
		case "error_rate":
			f.ErrorRate = h.ErrorRate
		case "latency_ms":
			f.LatencyMS = h.LatencyMS
		case "applied_response_lost":
			f.AppliedResponseLost = h.AppliedResponseLost
		case "webhook_duplicate":
			f.WebhookDuplicate = h.WebhookDuplicate
		case "webhook_reorder":
			f.WebhookReorder = h.WebhookReorder
		case "webhook_bad_signature":
			f.WebhookBadSignature = h.WebhookBadSignature
		case "webhook_delay_ms":
			f.WebhookDelayMS = h.WebhookDelayMS
		}
	}
	return f
}
