package peer

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pipestream/gateway/quicpeer"
)

// Files the peer keeps in its data dir when no --cert/--key is given.
const (
	CertFileName = "peer-cert.pem"
	KeyFileName  = "peer-key.pem"
)

// loadOrCreateCert returns the server certificate and its PEM: the
// configured files, else the data dir's pair, else a new self-signed pair
// written there (key 0600, written before the certificate, each atomically).
func loadOrCreateCert(o Options) (tls.Certificate, []byte, error) {
	if o.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return tls.Certificate{}, nil, fmt.Errorf("peer: load --cert %s / --key %s: %w", o.CertFile, o.KeyFile, err)
		}
		pemBytes, err := os.ReadFile(o.CertFile)
		if err != nil {
			return tls.Certificate{}, nil, fmt.Errorf("peer: %w", err)
		}
		return cert, pemBytes, nil
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("peer: data dir: %w", err)
	}
	certPath, keyPath := filepath.Join(o.DataDir, CertFileName), filepath.Join(o.DataDir, KeyFileName)
	if certPEM, err := os.ReadFile(certPath); err == nil {
		cert, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			return tls.Certificate{}, nil, fmt.Errorf("peer: %s exists but does not load with %s (delete both to regenerate): %w", certPath, keyPath, err)
		}
		o.Logger.Info("reusing peer certificate", "cert", certPath)
		return cert, certPEM, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return tls.Certificate{}, nil, fmt.Errorf("peer: %w", err)
	}
	cert, certPEM, err := quicpeer.SelfSignedCert(o.CertHosts...)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("peer: self-signed certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("peer: encode key: %w", err)
	}
	if err := writeFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return tls.Certificate{}, nil, err
	}
	if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
		return tls.Certificate{}, nil, err
	}
	o.Logger.Info("generated self-signed peer certificate; clients pin it", "cert", certPath, "key", keyPath)
	return cert, certPEM, nil
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	_, werr := f.Write(data)
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		return fmt.Errorf("peer: write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	syncDir(filepath.Dir(path))
	return nil
}
