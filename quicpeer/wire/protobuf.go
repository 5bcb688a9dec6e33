package wire

// protoCodec is replaced by the generated-type codec once gen/ exists.
type protoCodec struct{}

var protoCodecInstance Codec = protoCodec{}

func errNoProto() error { return Errorf(CodeInternalError, "protobuf codec not available yet") }

func (protoCodec) Format() Format                                      { return FormatProtobuf }
func (protoCodec) MarshalCapabilities(*Capabilities) ([]byte, error)   { return nil, errNoProto() }
func (protoCodec) UnmarshalCapabilities([]byte) (*Capabilities, error) { return nil, errNoProto() }
func (protoCodec) MarshalCheckpoint(*CheckpointFrame) ([]byte, error)  { return nil, errNoProto() }
func (protoCodec) UnmarshalCheckpoint([]byte) (*CheckpointFrame, error) {
	return nil, errNoProto()
}
func (protoCodec) MarshalEntityHeader(*EntityHeader) ([]byte, error)   { return nil, errNoProto() }
func (protoCodec) UnmarshalEntityHeader([]byte) (*EntityHeader, error) { return nil, errNoProto() }
func (protoCodec) MarshalPipeDoc(*PipeDoc) ([]byte, error)             { return nil, errNoProto() }
func (protoCodec) UnmarshalPipeDoc([]byte) (*PipeDoc, error)           { return nil, errNoProto() }
