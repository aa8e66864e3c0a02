package dispatcher

import (
	"fmt"
	"net/url"
)

// parseWorkersQuery reads GET /workers' parameters: detail (true/1 or false/0, default
// false), at most once. Unknown parameters are refused, so that a typo is not
// silently ignored.
func parseWorkersQuery(raw string) (detail bool, err error) {
	v, err := onlyParam(raw, "/workers", "detail")
	if err != nil {
		return false, err
	}
	switch v {
	case "", "false", "0":
		return false, nil
	case "true", "1":
		return true, nil
	}
	return false, fmt.Errorf("detail must be true or false")
}

// parseQueryString parses a raw query string whole. Not echo's QueryParams, which drop
// the parse error and with it every pair after a bad escape or a semicolon: a
// parameter would be silently lost and the request carried out without it.
func parseQueryString(raw string) (url.Values, error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return nil, fmt.Errorf("query string: %w", err)
	}
	return q, nil
}

// parseDrainQuery reads POST /workers/{id}/drain's only parameter, reason (optional).
func parseDrainQuery(raw string) (reason string, err error) {
	return onlyParam(raw, "drain", "reason")
}

// onlyParam parses the raw query string of an endpoint that takes one parameter, name,
// at most once, and returns its value ("" when absent). Any other parameter is refused,
// so that a typo is not silently ignored.
func onlyParam(raw, endpoint, name string) (string, error) {
	q, err := parseQueryString(raw)
	if err != nil {
		return "", err
	}
	for n, vs := range q {
		if n != name {
			return "", fmt.Errorf("unknown parameter %q; %s takes only %s", n, endpoint, name)
		}
		if len(vs) > 1 {
			return "", fmt.Errorf("%s is given %d times", name, len(vs))
		}
	}
	return q.Get(name), nil
}

// parseTaskID checks the id of GET /tasks/{id} with the rules of a submitted task_id,
// so that a malformed or oversized id gets 400 rather than a lookup.
func parseTaskID(id string) (string, error) {
	if id == "" {
		return "", badRequest("task id is required")
	}
	if err := checkName("task id", id, maxIDLength, true); err != nil {
		return "", err
	}
	return id, nil
}
