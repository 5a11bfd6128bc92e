// Package api holds the OpenAPI 3.1 description of the writer's HTTP API,
// openapi.json, which the writer serves at /openapi.json. A test of the
// writer fails when the spec and the handlers disagree on a route, a status
// or an error code.
package api

import _ "embed"

// OpenAPI is the writer's API description, OpenAPI 3.1 as JSON.
//
//go:embed openapi.json
var OpenAPI []byte
