use super::*;
use crate::policy::load;
use crate::policy::test_folder::TestFolder;

const GATEWAY: &str = "listen = \"127.0.0.1:9000\"\n\n[local_gpu_host]\nworkers = 2\n";

fn tenant(id: &str, extra: &str) -> String {
    format!(
        "id = \"{id}\"\nmodels = []\n\n[jwt]\nissuer = \"https://{id}.example\"\n\
         audience = [\"bulkhead\"]\nalgorithms = [\"EdDSA\"]\n{extra}"
    )
}

const LIMITS: &str = "\n[limits]\nrequests_per_s = 10\nburst = 20\nmax_concurrent = 4\n";

fn folder() -> TestFolder {
    let folder = TestFolder::new();
    folder
        .write("gateway.toml", GATEWAY)
        .write("classes/basic.toml", "[limits]\nmax_tokens = 512\n")
        .write("tenants/acme.toml", tenant("acme", LIMITS))
        .write("tenants/beta.toml", tenant("beta", LIMITS));
    folder
}

fn policy(folder: &TestFolder) -> Policy {
    load(folder.path()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn removing_a_tenant_or_lowering_its_limits_only_restricts() {
    let folder = folder();
    let old = policy(&folder);
    assert_eq!(only_restricts(&old, &old), Ok(()));
    folder.remove("tenants/beta.toml");
    assert_eq!(only_restricts(&old, &policy(&folder)), Ok(()));
    folder.write(
        "tenants/acme.toml",
        tenant(
            "acme",
            "\n[limits]\nrequests_per_s = 1\nburst = 2\nmax_concurrent = 1\n",
        ),
    );
    assert_eq!(only_restricts(&old, &policy(&folder)), Ok(()));
    // A class file may change too: tenants are compared as resolved.
    folder.write("classes/basic.toml", "[limits]\nmax_tokens = 64\n");
    assert_eq!(only_restricts(&old, &policy(&folder)), Ok(()));
}

#[test]
fn anything_that_grants_is_named() {
    let cases = [
        (
            "tenants/acme.toml",
            tenant(
                "acme",
                "\n[limits]\nrequests_per_s = 11\nburst = 20\nmax_concurrent = 4\n",
            ),
            "tenant `acme`: `requests_per_s` was raised or changed",
        ),
        (
            "tenants/acme.toml",
            tenant("acme", &format!("{LIMITS}per_sub = true\n")),
            "tenant `acme`: `per_sub` was raised or changed",
        ),
        (
            "tenants/acme.toml",
            tenant(
                "acme",
                &format!("{LIMITS}\n[prompts]\nparse_special = true\n"),
            ),
            "tenant `acme`: `parse_special` was turned on",
        ),
        (
            "tenants/acme.toml",
            tenant(
                "acme",
                &format!("{LIMITS}\n[telemetry]\nrecord_content = true\n"),
            ),
            "tenant `acme`: `[telemetry] record_content` was turned on",
        ),
        (
            "tenants/acme.toml",
            tenant("acme", &format!("{LIMITS}\n[gpu]\nweight = 3\n")),
            "tenant `acme`: its `[gpu]` changed",
        ),
        (
            "tenants/gamma.toml",
            tenant("gamma", LIMITS),
            "tenant `gamma` was added",
        ),
        (
            "gateway.toml",
            format!("{GATEWAY}queue_capacity = 8\n"),
            "`gateway.toml` changed",
        ),
        ("trust.toml", String::new(), "`trust.toml` was added"),
    ];
    for (file, text, why) in cases {
        let folder = folder();
        let old = policy(&folder);
        folder.write(file, &text);
        assert_eq!(
            only_restricts(&old, &policy(&folder)),
            Err(why.to_string()),
            "{file}"
        );
    }
}
