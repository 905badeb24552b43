package postgres

import (
	"context"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
)

// Name is the variant's name in the lab.
const Name lab.StoreName = "postgres"

// Variant declares the postgres store to the registry.
func Variant() variant.Variant {
	return variant.Variant{
		Name:        Name,
		Label:       "one transaction",
		Decides:     "INSERT … ON CONFLICT on (tenant, endpoint, key), with charge, outbox event and stored response in one transaction",
		Keys:        "PostgreSQL table idempotency_requests, claimed by INSERT … ON CONFLICT in the charge's transaction",
		RequiresKey: true,
		Effects:     "outbox",
		Crash:       variant.CrashRollsBack,
		Needs:       []variant.Need{variant.NeedPostgres},
		HowToEnable: "set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/test), or install the PostgreSQL server (initdb) for a throwaway cluster",
		Open: func(_ context.Context, d variant.Deps) (lab.Store, error) {
			return New(Config{Table: DefaultTable, Pool: d.Postgres, Window: d.Window, Wait: d.Wait, AppName: d.AppName, ResetPools: d.ResetPools, Now: d.Clock})
		},
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.CaseRetries: {Usual: lab.Holds, Holds: "INSERT … ON CONFLICT on the primary key picks one owner; the others wait on its row lock, then replay the committed response",
				Breaks: "the unique key did not stop a duplicate"},
			variant.CaseReplicas: {Usual: lab.Holds, Holds: "every replica inserts into the same unique index: one owner across them all",
				Breaks: "the unique key did not stop a duplicate across replicas"},
			variant.FaultCase(lab.FaultSlow): {Usual: lab.Holds, Holds: "the row lock lasts exactly as long as the transaction: twins wait (bounded, then 409) and replay after the commit",
				Breaks: "slowness let a twin in"},
			variant.FaultCase(lab.FaultCrashAfterClaim): {Usual: lab.Holds, Holds: "the crash rolled back the open transaction, claim included: the retry charged once",
				Breaks: "the rolled-back claim still let two charges in"},
			variant.FaultCase(lab.FaultCrashAfterCharge): {Usual: lab.Holds, Holds: "key, charge, outbox event and response committed together: the retry after the lost response replays the original charge",
				Breaks: "the lost response led to a second charge"},
			variant.FaultCase(lab.FaultOutboxFail): {Usual: lab.Holds, Holds: "the failed outbox insert rolled back charge and key together: nothing stayed, and the retry charged once",
				Breaks: "the failed write left a charge behind"},
			variant.FaultCase(lab.FaultAppliedResponseLost): variant.RelayReplaysCapture(),
			variant.FaultCase(lab.FaultStoreRestart): {Usual: lab.Holds, Holds: "the connections died but the committed rows did not: the retry replays",
				Breaks: "the restart lost a committed key"},
			variant.FaultCase(lab.FaultExpired): {Usual: lab.Breaks, Holds: "after the window the key row is reclaimed, but the unique (tenant, order_id) constraint refuses a second charge: the permanent domain key holds",
				Breaks: "past the retention window the key is new again: without a permanent domain key (order_id) the late retry charges again"},
			variant.FaultCase(lab.FaultStaleWorker): {Usual: lab.Holds, Holds: "the paused worker's transaction kept its row lock for the whole pause: the retry waited (bounded by the in-flight wait) and replayed — at the price of a connection and a row lock held for as long as the pause",
				Breaks: "the pause outlasted the bounded wait"},
			variant.FaultCase(lab.FaultFailover): {Usual: lab.Holds, Holds: "the key lives in PostgreSQL, committed with the charge: a Redis failover does not touch it",
				Breaks: "a duplicate got in"},
			variant.FaultCase(lab.FaultPGFailover): {Usual: lab.Breaks, UsualWith: variant.ReplicationDecides,
				Holds:  "synchronous replication: the commit of key, charge and outbox event waited for the standby, so nothing the client was told of was missing from it; the first attempt's client got no answer, and its retry charged once on the new primary",
				Breaks: "asynchronous replication: the primary acknowledged key, charge and outbox event before the standby had them; the promoted standby never received them, so the retry found no key and charged again, and the relay had already captured the lost charge"},
			variant.CaseReused: {Usual: lab.Holds, Holds: "the stored fingerprint differs: the other amount gets 422 and charges nothing",
				Breaks: "the other amount was charged"},
			variant.CaseTenants: {Usual: lab.Holds, Holds: "the primary key is (tenant, endpoint, key): each tenant is charged once",
				Breaks: "the tenants' keys collided"},
		},
	}
}
