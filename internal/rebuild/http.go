package rebuild

import (
	"net/http"

	"github.com/converge-sync/converge/internal/httpjson"
)

// AdminPath is where a projector process serves its rebuilds: POST starts
// one (202, or 200 with the one in progress), GET reports its status.
const AdminPath = "/v1/admin/rebuild"

// Routes are the manager's HTTP routes, for the projector's metrics
// address.
func (m *Manager) Routes() map[string]http.Handler {
	return map[string]http.Handler{
		"GET " + AdminPath: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			httpjson.Write(w, http.StatusOK, m.Status(r.Context()))
		}),
		"POST " + AdminPath: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, started, err := m.Start(r.Context())
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
