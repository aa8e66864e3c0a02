package dispatcher

import (
	"fmt"
	"net/url"
)

// parseWorkersQuery reads GET /workers' parameters: detail (true/1 or false/0, default
// false), at most once. Unknown parameters are refused, so that a typo is not
// silently ignored.
func parseWorkersQuery(q url.Values) (detail bool, err error) {
	for name, vs := range q {
		if name != "detail" {
			return false, fmt.Errorf("unknown parameter %q; /workers takes only detail", name)
		}
		if len(vs) > 1 {
			return false, fmt.Errorf("detail is given %d times", len(vs))
		}
	}
	switch q.Get("detail") {
	case "", "false", "0":
		return false, nil
	case "true", "1":
		return true, nil
	}
	return false, fmt.Errorf("detail must be true or false")
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
