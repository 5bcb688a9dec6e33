package quicpeer

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// SelfSignedCert makes an ECDSA P-256 certificate for hosts (DNS names or IP
// addresses; default "localhost", "127.0.0.1", "::1"), valid for one year.
// It returns the certificate for a server's tls.Config and its PEM encoding,
// which a client pins with ClientTLS (the peer writes it to disk for that).
func SelfSignedCert(hosts ...string) (tls.Certificate, []byte, error) {
	if len(hosts) == 0 {
		hosts = []string{"localhost", "127.0.0.1", "::1"}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "pipestream peer " + hosts[0]},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true, // self-signed and pinned: it is its own root
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return cert, certPEM, nil
}

// ServerTLS returns a TLS 1.3 server config for cert with the PipeStream ALPN.
func ServerTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS13,
		NextProtos:   []string{ALPN},
	}
}

// ClientTLS returns a TLS 1.3 client config that trusts only the
// certificates in caPEM (a CA bundle or a pinned self-signed certificate).
func ClientTLS(caPEM []byte) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("quicpeer: no PEM certificate found in the CA data; pass the peer's certificate file or a CA bundle")
	}
	return &tls.Config{
		RootCAs:    pool,
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{ALPN},
	}, nil
}

// secureTLS clones c and forces what Section 10.1 requires: TLS 1.3 or
// later and the pipestream/1 ALPN. There is no way to turn encryption off.
func secureTLS(c *tls.Config) (*tls.Config, error) {
	if c == nil {
		return nil, errors.New("quicpeer: Config.TLS is required (TLS 1.3 is mandatory, Section 10.1)")
	}
	if c.MaxVersion != 0 && c.MaxVersion < tls.VersionTLS13 {
		return nil, fmt.Errorf("quicpeer: Config.TLS.MaxVersion %#x is below TLS 1.3; PipeStream requires TLS 1.3 (Section 10.1)", c.MaxVersion)
	}
	c = c.Clone()
	if c.MinVersion < tls.VersionTLS13 {
		c.MinVersion = tls.VersionTLS13
	}
	c.NextProtos = []string{ALPN}
	return c, nil
}
