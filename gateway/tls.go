package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSConfigs are the three TLS configurations of a TLS-serving Server:
// the gRPC listener's, the HTTP listener's, and the REST proxy's client
// configuration for dialing the gRPC listener.
type TLSConfigs struct {
	GRPC, HTTP, InternalDial *tls.Config
}

// ServerTLSFiles loads a PEM certificate chain and key for both listeners
// (TLS 1.2 minimum: API clients include curl and browsers; the QUIC side is
// TLS 1.3 only regardless). The internal dial trusts exactly the leaf
// certificate (a pin, whatever CA issued it) under the leaf's first DNS or
// IP name, because it dials the listener's own loopback address.
func ServerTLSFiles(certFile, keyFile string) (TLSConfigs, error) {
	if certFile == "" || keyFile == "" {
		return TLSConfigs{}, errors.New("gateway: TLS needs both --tls-cert and --tls-key")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return TLSConfigs{}, fmt.Errorf("gateway: load --tls-cert %s / --tls-key %s: %w", certFile, keyFile, err)
	}
	return ServerTLS(cert)
}

// ServerTLS is ServerTLSFiles for a loaded certificate.
func ServerTLS(cert tls.Certificate) (TLSConfigs, error) {
	if len(cert.Certificate) == 0 {
		return TLSConfigs{}, errors.New("gateway: the TLS certificate is empty")
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return TLSConfigs{}, fmt.Errorf("gateway: parse TLS certificate: %w", err)
	}
	var name string
	switch {
	case len(leaf.DNSNames) > 0:
		name = leaf.DNSNames[0]
	case len(leaf.IPAddresses) > 0:
		name = leaf.IPAddresses[0].String()
	default:
		return TLSConfigs{}, errors.New("gateway: the TLS certificate has no DNS or IP subject alternative name; clients (and the REST proxy) verify names against the SAN, so issue it with one")
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	base := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	return TLSConfigs{
		GRPC:         base.Clone(),
		HTTP:         base.Clone(),
		InternalDial: &tls.Config{RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS12},
	}, nil
}

// ClientTLS returns a client configuration that trusts the PEM certificates
// in caFile (a CA bundle or the server's own certificate), for the client
// verbs and tests. serverName overrides the name verified ("" : the host
// dialed).
func ClientTLS(caFile, serverName string) (*tls.Config, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read --tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--tls-ca %s holds no PEM certificate", caFile)
	}
	return &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}, nil
}
