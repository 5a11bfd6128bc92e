package rebuild

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/converge-sync/converge/internal/httpjson"
)

// AdminPath is where a projector process serves its rebuilds: POST starts
// one (202, or 200 with the one in progress), of the whole store or, with
// ?partition=P, of that partition alone; GET reports its status.
const AdminPath = "/v1/admin/rebuild"

// Routes are the manager's HTTP routes, for the projector's metrics
// address.
func (m *Manager) Routes() map[string]http.Handler {
	return map[string]http.Handler{
		"GET " + AdminPath: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			httpjson.Write(w, http.StatusOK, m.Status(r.Context()))
		}),
		"POST " + AdminPath: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var (
				started bool
				err     error
			)
			if qs, ok := r.URL.Query()["partition"]; ok {
				q := qs[0]
				part, perr := strconv.Atoi(q)
				if perr != nil {
					httpjson.Error(w, http.StatusBadRequest, "invalid_partition", fmt.Sprintf("partition %q is not a number", q))
					return
				}
				_, started, err = m.StartPartition(r.Context(), part)
			} else {
				_, started, err = m.Start(r.Context())
			}
			if errors.Is(err, ErrInvalid) {
				httpjson.Error(w, http.StatusBadRequest, "invalid_partition", err.Error())
				return
			}
			if err != nil {
				httpjson.Error(w, http.StatusServiceUnavailable, "rebuild_unavailable", err.Error())
				return
			}
			status := http.StatusOK
			if started {
				status = http.StatusAccepted
			}
			httpjson.Write(w, status, m.Status(r.Context()))
		}),
	}
}
