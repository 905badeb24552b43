package labtest

import "errors"

// WithServicesUninstalled is WithServices on a machine without PostgreSQL's
// or Redis's server binaries.
func WithServicesUninstalled(m M) M {
	none := func() (string, error) { return "", errors.New("not installed") }
	return services{m: m, findPostgres: none, findRedis: none}
}
