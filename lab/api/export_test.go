package api

import (
	"encoding/json"

	"github.com/idempotency-lab/lab/lab"
)

// MatrixFailureLine is the ndjson line that ends a matrix which stopped on
// p, as streamMatrix writes it.
func MatrixFailureLine(p lab.Problem) []byte {
	b, _ := json.Marshal(matrixFailure{Error: p})
	return b
}
