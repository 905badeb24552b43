package experiment

import "github.com/idempotency-lab/lab/lab"

// mechanism explains one (store, case): what the store does, and why that
// holds or breaks. Each text is written for the outcome it names; a run whose
// outcome differs from the usual one says so.
type mechanism struct {
	usual  string // the verdict this design usually reaches
	holds  string
	breaks string
}

// caseMulti is the retry storm spread over several replicas.
const caseMulti = "replicas"

var mechanisms = map[string]map[string]mechanism{
	lab.StoreUnsafe: {
		"":                        {Breaks, "only one attempt reached the server", "no key is checked: every attempt is a new charge"},
		caseMulti:                 {Breaks, "only one attempt reached the servers", "no key is checked on any replica: every attempt is a new charge"},
		lab.FaultSlow:             {Breaks, "only one attempt reached the server", "no key is checked, so slowness changes nothing: every attempt charges"},
		lab.FaultCrashAfterClaim:  {Breaks, "the crash came before the charge and only one retry followed", "nothing was claimed; the crashed attempt charged nothing, but every retry charges"},
		lab.FaultCrashAfterCharge: {Breaks, "only one attempt reached the server", "the lost response leaves a charge the client cannot see; its retries charge again"},
		lab.FaultOutboxFail:       {Breaks, "only one attempt reached the server", "the receipt is sent directly, outside any transaction: the failed send leaves a charge whose receipt never went out, and every retry charges again"},
		lab.FaultStoreRestart:     {Breaks, "only one attempt reached the server", "there is no state to lose: every retry charges anyway"},
		lab.FaultExpired:          {Breaks, "the order id's unique constraint in the ledger refused the second charge", "no key is checked: the late retry charges like every other"},
		ScenarioReused:            {Breaks, "only the first attempt could charge", "the key is ignored, so another amount under the same key is simply another charge"},
		ScenarioTenants:           {Breaks, "each tenant was charged once", "no key is checked: each tenant's attempts all charge"},
	},
	lab.StoreMemory: {
		"":                        {Holds, "one replica, one map: the mutex lets one attempt claim the key; the others wait for its response and replay it", "the map did not stop a duplicate on one replica"},
		caseMulti:                 {Breaks, "every attempt reached the same map", "each replica has its own map in its own heap: each one lets its first attempt charge, one charge per replica"},
		lab.FaultSlow:             {Holds, "the claim lives as long as the work: twins wait on the in-flight entry and replay it, or get 409 after the bounded wait", "slowness let a twin in"},
		lab.FaultCrashAfterClaim:  {Holds, "the crash lost the map with the claim, but nothing was charged: the retry charges once", "the crash lost the claim and more than one retry charged"},
		lab.FaultCrashAfterCharge: {Breaks, "the key survived the crash", "the crash wiped the process heap after the charge: the map no longer knows the key, so the retry charges again"},
		lab.FaultOutboxFail:       {Holds, "the ledger refused the charge with its event, the claim was released, and the retry charged once", "the failed write left a charge behind"},
		lab.FaultStoreRestart:     {Breaks, "the key survived the restart", "a restart forgets every key in the heap: the retry of a completed charge charges again"},
		lab.FaultExpired:          {Breaks, "the order id's unique constraint in the ledger refused the second charge", "the key was evicted after its window: the late retry is a new operation"},
		ScenarioReused:            {Holds, "the stored fingerprint differs: the other amount gets 422 and charges nothing", "the other amount was charged"},
		ScenarioTenants:           {Holds, "keys are scoped by (tenant, endpoint, key): each tenant is charged once and sees only its own response", "the tenants' keys collided"},
	},
	lab.StoreRedis: {
		"":                        {Holds, "SET NX lets one attempt claim the key; the others poll for the completed record and replay it", "SET NX did not stop a duplicate"},
		caseMulti:                 {Holds, "every replica claims in the same Redis: one SET NX wins across them all", "the shared claim did not stop a duplicate"},
		lab.FaultSlow:             {Breaks, "the claim outlived the work (ttl_ms ≥ work_ms): the twins waited and replayed", "the claim's TTL ran out while the first attempt was still working: a retry claimed the free key and charged again"},
		lab.FaultCrashAfterClaim:  {Holds, "the claim stayed behind without a charge: retries got 409 until its TTL, then one of them charged once", "the stale claim expired and more than one retry charged"},
		lab.FaultCrashAfterCharge: {Breaks, "the retries gave up before the stale claim expired", "the charge committed in the ledger but the completed record never reached Redis: the claim expired and a retry charged again — key and ledger share no commit"},
		lab.FaultOutboxFail:       {Holds, "the ledger refused the charge with its event; the claim was released (compare-and-delete on its token) and the retry charged once", "the failed write left a charge behind"},
		lab.FaultStoreRestart:     {Breaks, "the record survived the restart", "Redis without persistence restarted empty: the completed record is gone, so the retry charges again"},
		lab.FaultExpired:          {Breaks, "the order id's unique constraint in the ledger refused the second charge", "the record expired with its TTL: the late retry is a new operation"},
		ScenarioReused:            {Holds, "the stored fingerprint differs: the other amount gets 422 and charges nothing", "the other amount was charged"},
		ScenarioTenants:           {Holds, "Redis keys carry tenant and endpoint: each tenant is charged once", "the tenants' keys collided"},
	},
	lab.StorePostgres: {
		"":                        {Holds, "INSERT … ON CONFLICT on the primary key picks one owner; the others wait on its row lock, then replay the committed response", "the unique key did not stop a duplicate"},
		caseMulti:                 {Holds, "every replica inserts into the same unique index: one owner across them all", "the unique key did not stop a duplicate across replicas"},
		lab.FaultSlow:             {Holds, "the row lock lasts exactly as long as the transaction: twins wait (bounded, then 409) and replay after the commit", "slowness let a twin in"},
		lab.FaultCrashAfterClaim:  {Holds, "the crash rolled back the open transaction, claim included: the retry charged once", "the rolled-back claim still let two charges in"},
		lab.FaultCrashAfterCharge: {Holds, "key, charge, outbox event and response committed together: the retry after the lost response replays the original charge", "the lost response led to a second charge"},
		lab.FaultOutboxFail:       {Holds, "the failed outbox insert rolled back charge and key together: nothing stayed, and the retry charged once", "the failed write left a charge behind"},
		lab.FaultStoreRestart:     {Holds, "the connections died but the committed rows did not: the retry replays", "the restart lost a committed key"},
		lab.FaultExpired:          {Breaks, "after the window the key row is reclaimed, but the unique (tenant, order_id) constraint refuses a second charge: the permanent domain key holds", "past the retention window the key is new again: without a permanent domain key (order_id) the late retry charges again"},
		ScenarioReused:            {Holds, "the stored fingerprint differs: the other amount gets 422 and charges nothing", "the other amount was charged"},
		ScenarioTenants:           {Holds, "the primary key is (tenant, endpoint, key): each tenant is charged once", "the tenants' keys collided"},
	},
}

// caseOf names the mechanism a run exercises.
func caseOf(spec Spec, replicas int) string {
	switch {
	case spec.Scenario != "" && spec.Scenario != ScenarioRetries:
		return spec.Scenario
	case spec.Faults.Point == "" && replicas > 1:
		return caseMulti
	}
	return spec.Faults.Point
}

// Expected is the verdict a design usually reaches on this run.
func Expected(spec Spec, replicas int) string {
	c := caseOf(spec, replicas)
	m, ok := mechanisms[spec.Store][c]
	switch {
	case !ok:
		return ""
	case c == lab.FaultExpired && spec.OrderID != "":
		// The order id is a constraint of the ledger: it holds whatever store is in front.
		return Holds
	case c == lab.FaultSlow && spec.Store == lab.StoreRedis && spec.Faults.ClaimTTL >= spec.Faults.Work+spec.Faults.Work/2:
		return Holds // the claim comfortably outlives the work
	}
	return m.usual
}

// Explain returns the mechanism behind a run's verdict, saying so when the
// run did not end the way this design usually does.
func Explain(spec Spec, replicas int, verdict string) string {
	if verdict == Inconclusive {
		return "the attempts did not all get an answer a client can act on (see the timeline), so this run says nothing about the store"
	}
	m, ok := mechanisms[spec.Store][caseOf(spec, replicas)]
	if !ok {
		return ""
	}
	text := m.holds
	if verdict == Breaks {
		text = m.breaks
	}
	if usual := Expected(spec, replicas); verdict != usual {
		text = "Unexpectedly " + verdict + ": " + text
	}
	return text
}
