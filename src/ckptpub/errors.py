"""The one exception type ckptpub raises for input it cannot use.

Every message is a single line that names the file, tensor or manifest field at
fault, because the CLI prints it as is and users act on it without a traceback.
"""


class CkptpubError(Exception):
    """Unusable input: a malformed checkpoint or manifest, a missing file, a bad path.

    The CLI maps it to exit code 2. A checkpoint whose bytes differ from a valid
    manifest is not an error but a verification result (see ``VerifyReport``).
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
