// Package e2e holds the lab's end-to-end tests: each starts whole labs on
// loopback, with every built-in design (variants.Builtin), the real
// PostgreSQL and Redis, and the payment provider, and drives them over
// HTTP as attendees, instructors and attackers do. Every figure a test
// checks is read from the ledger, the outbox or the stores' key state.
// The package has no code of its own; the design packages' own tests
// (variants/<design>) and the conformance suite hold each design alone.
package e2e
