"""Runs LocalStack's SQS emulator in this process, on GATEWAY_LISTEN.

LocalStack's own launcher expects a container or plugin entry points that the
PyPI wheel does not carry; this starts the same runtime with the AWS
components directly. Used by `scripts/localstack-sqs` (benchmarks only).
"""

from localstack.aws.components import AwsComponents
from localstack.logging.setup import setup_logging_from_config
from localstack.runtime import current, runtime

setup_logging_from_config()
server = runtime.LocalstackRuntime(AwsComponents())
current.set_current_runtime(server)
server.run()
