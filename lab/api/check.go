package api

import (
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
)

// chargesUnderKey is GET /charges?store=&key=: the ledger's charges under
// one of the caller's keys, oldest first — the read-back that shows a
// second charge no answer names (lab check -readback reads it).
func (s *Server) chargesUnderKey(c echo.Context) error {
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	store, err := q.Name("store", string(s.cfg.DefaultStore))
	if err != nil {
		return err
	}
	key, err := q.Text("key", "", lab.MaxKeyBytes)
	if err != nil {
		return err
	}
	if key == "" {
		return lab.Invalid("key", "is required: the key whose charges to list")
	}
	if _, err := s.pickStore(store); err != nil {
		return err
	}
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	t, err := s.deps.Books.KeyCharges(c.Request().Context(), who.Tenant, lab.StoreName(store), key)
	if err != nil {
		return fmt.Errorf("%w: %w", lab.ErrStoreUnavailable, err)
	}
	return c.JSON(http.StatusOK, keyChargesAnswer{Tenant: who.Tenant, Store: store, Key: key, Charges: append([]string{}, t.IDs...), AmountCents: t.Cents})
}

// keyChargesAnswer is GET /charges.
type keyChargesAnswer struct {
	Tenant      string   `json:"tenant"`
	Store       string   `json:"store"`
	Key         string   `json:"key"`
	Charges     []string `json:"charges"` // charge ids, oldest first
	AmountCents int64    `json:"amount_cents"`
}

// checkDesign is /lab/check?store=: lab check's suite run against one of
// this lab's own designs, as the caller (format=json|markdown|table).
// Another target is the command line's: a URL field on a shared server
// would let anyone aim requests at whatever the server reaches.
func (s *Server) checkDesign(c echo.Context) error {
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	store, err := q.Name("store", string(s.cfg.DefaultStore))
	if err != nil {
		return err
	}
	format, err := q.Choice("format", "json", "json", "markdown", "table")
	if err != nil {
		return err
	}
	if _, err := s.pickStore(store); err != nil {
		return err
	}
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	if who.admin {
		return lab.Invalid("Authorization", "the admin charges nobody, so checks no design: use an attendee's token")
	}
	rep, err := s.deps.Service.CheckDesign(c.Request().Context(), who.Identity, lab.StoreName(store), s.cfg.FaultsEnabled)
	if err != nil {
		return err
	}
	return writeMatrix(c, format, rep)
}
