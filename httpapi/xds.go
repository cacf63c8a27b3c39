package httpapi

import (
	"net/http"
	"strconv"

	"github.com/regcluster/registry/internal/render"
	registryv1 "github.com/regcluster/registry/proto/registry/v1"
)

// xdsClients answers GET /api/v1/xds/clients: every regnode's xDS
// streams, or with ?local=true the answering regnode's only, as `regctl
// xds clients -o json` prints them (a regnode that could not be asked
// carries its error).
func (a *API) xdsClients(w http.ResponseWriter, r *http.Request) {
	if e := query(r, "local"); e != nil {
		writeError(w, http.StatusBadRequest, e)
		return
	}
	local, e := boolParam(r, "local")
	if e != nil {
		writeError(w, http.StatusBadRequest, e)
		return
	}
	ctx, cancel := a.call(r)
	defer cancel()
	resp, err := a.rpc.XdsClients(ctx, &registryv1.XdsClientsRequest{All: !local})
	if err != nil {
		a.writeRPCError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, render.NewXdsClients(resp))
}

// boolParam reads the boolean query parameter name (false when absent).
func boolParam(r *http.Request, name string) (bool, *apiError) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, badField(name, "%q is not a boolean (true or false)", v)
	}
	return b, nil
}
