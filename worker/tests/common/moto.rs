//! moto's server mode (`tests/ground/moto.sh start`) for the SQS and S3 dead-letter destinations.

/// moto's endpoint: `$LEASEHOLD_MOTO_ENDPOINT`, else the one `tests/ground/moto.sh start` wrote down;
/// panics (the test fails loudly) when moto is not running.
pub fn moto_endpoint() -> String {
    let from_file = || {
        let text = std::fs::read_to_string(leasehold_testkit::state_dir().join("moto.env")).ok()?;
        text.lines().find_map(|l| l.strip_prefix("LEASEHOLD_MOTO_ENDPOINT=")).map(str::to_string)
    };
    let endpoint = std::env::var("LEASEHOLD_MOTO_ENDPOINT").ok().or_else(from_file).unwrap_or_else(|| {
        panic!("moto's endpoint is unknown: start it with tests/ground/moto.sh start (make test does)")
    });
    let authority = endpoint.trim_start_matches("http://");
    assert!(
        std::net::TcpStream::connect(authority).is_ok(),
        "moto is not answering at {endpoint}: start it with tests/ground/moto.sh start"
    );
    endpoint
}

/// SQS and S3 clients of moto at `endpoint` (S3 path-style).
pub async fn moto_clients(endpoint: &str) -> (aws_sdk_sqs::Client, aws_sdk_s3::Client) {
    let sdk = leasehold_testkit::sdk_config(endpoint.to_string()).await;
    let s3 = aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true).build();
    (aws_sdk_sqs::Client::new(&sdk), aws_sdk_s3::Client::from_conf(s3))
}

/// `yaml` (a worker config from `common::config`) sending SQS and S3 calls to moto at `endpoint`.
pub fn with_moto(yaml: &str, endpoint: &str) -> String {
    yaml.replacen(
        "dynamodbEndpoint: '",
        &format!("sqsEndpoint: '{endpoint}', s3Endpoint: '{endpoint}', dynamodbEndpoint: '"),
        1,
    )
}
