// Package e2e holds what the lab's end-to-end tests share: labs configured
// as the command builds them, with every built-in design
// (variants.Builtin), the real PostgreSQL and Redis, and the payment
// provider, and the reads of the ledger every test checks against. The
// tests drive whole labs on loopback over HTTP, as attendees, instructors
// and attackers do: the contract in this directory's tests, and one
// package each for the matrix and its explanations (matrix), the
// failovers and stepped races (failover), the effects through the outbox
// and the provider (effects), and the attacks on a shared lab (attack).
// Every figure a test checks is read from the ledger, the outbox or the
// stores' key state. The design packages' own tests (variants/<design>)
// and the conformance suite hold each design alone.
package e2e
