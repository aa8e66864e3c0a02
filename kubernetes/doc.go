// Package kubernetes holds the checks of smartroute's deployment files that can run without
// Docker or a cluster: the Helm chart rendered in-process and every manifest decoded strictly
// into its Kubernetes API type (chart_test.go), and the Dockerfile read as text
// (dockerfile_test.go). It is its own module so that Helm's and Kubernetes' dependencies stay
// out of the others.
package kubernetes
